"""The offline streamer's rate on the main thread, on a fresh thread and on a persistent thread, interleaved.

Record of the fifth 2026-11-25 session (serving); run from the repository root:

    python bench/experiments/2026-11-25-cpu-serve-fifth-session/thread_vs_main.py

(quoted in bench/results/2026-11-25-cpu-serve/fifth-session/README.md).
"""
import queue
import statistics
import threading

from dmae_fast.bench.serve import ServeBenchConfig, offline_rate


def in_thread(f):
    out=[]
    t=threading.Thread(target=lambda: out.append(f()))
    t.start()
    t.join()
    return out[0]


def main() -> None:
    cfg = ServeBenchConfig()
    offline_rate(cfg)
    in_thread(lambda: offline_rate(cfg))
    R={"main":[], "thread":[], "thread-persistent":[]}
    q_in, q_out = queue.Queue(), queue.Queue()
    def worker():
        while True:
            f=q_in.get()
            q_out.put(f())
    threading.Thread(target=worker, daemon=True).start()
    q_in.put(lambda: offline_rate(cfg))
    q_out.get()
    for r in range(4):
        R["main"].append(offline_rate(cfg))
        R["thread"].append(in_thread(lambda: offline_rate(cfg)))
        q_in.put(lambda: offline_rate(cfg))
        R["thread-persistent"].append(q_out.get())
        print({k: round(v[-1]) for k,v in R.items()}, flush=True)
    for k,v in R.items():
        print(k, round(statistics.median(v)))


if __name__ == "__main__":
    main()
