"""How often does a SIGINT sent during compiled-noise calls never reach the caller?

Record of the seventh 2026-11-25 session (the CI failure of 290c877); run from the repository root:

    python bench/experiments/2026-11-25-signal-loss/swallow.py > bench/results/2026-11-25-signal-loss/swallow.txt 2>&1

The main thread calls the compiled noise (dmae_fast.noise.compiled.NoiseSource, 500 demo rows) for
50 ms per trial while a helper thread sends SIGINT to the process 0.5-10 ms in. The handler counts
its calls, notes the innermost frames it interrupted, and raises; the trial counts the exceptions
that arrive. A handler call whose exception never arrives was swallowed on the way.
"""
import collections
import os
import random
import signal
import threading
import time
import traceback

import torch

from dmae_fast.noise.compiled import NoiseSource

TRIALS = int(os.environ.get("TRIALS", 1500))


class Stop(BaseException):
    pass


calls, where = 0, collections.Counter()


def handler(signum, frame):
    global calls
    calls += 1
    frames = traceback.extract_stack(frame)[-3:]
    where[" <- ".join(f"{f.filename.split('site-packages/')[-1]}:{f.lineno}" for f in reversed(frames))] += 1
    raise Stop()


def send_soon():
    time.sleep(random.uniform(0.0005, 0.01))
    os.kill(os.getpid(), signal.SIGINT)


def main() -> None:
    torch.set_num_threads(1)
    random.seed(0)
    signal.signal(signal.SIGINT, handler)
    noise, clean, n = NoiseSource(torch.device("cpu")), torch.rand(4, 1, 28, 28), 500
    zeros = torch.zeros(n, dtype=torch.int64)
    noise(clean, zeros, 0.25, 0, zeros, zeros, torch.arange(n))  # compile outside the trials
    arrived = 0
    for _ in range(TRIALS):
        sender = threading.Thread(target=send_soon)
        try:
            sender.start()
            end = time.perf_counter() + 0.05
            while time.perf_counter() < end:
                noise(clean, zeros.clone(), 0.25, 0, zeros.clone(), zeros.clone(), torch.arange(n))
        except Stop:
            arrived += 1
        sender.join()
        try:
            time.sleep(0.001)  # a signal that lands after the loop
        except Stop:
            arrived += 1
    print(f"torch {torch.__version__}: {TRIALS} trials, {calls} handler calls, {arrived} exceptions arrived, "
          f"{calls - arrived} swallowed")
    print("innermost frames interrupted (count):")
    for frames, count in where.most_common(8):
        print(f"  {count:5d}  {frames}")


if __name__ == "__main__":
    main()
