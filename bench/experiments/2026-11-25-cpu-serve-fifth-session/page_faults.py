"""Minor page faults per 1,000 samples: in the server, and in the offline streamer on the main thread and on another.

Record of the fifth 2026-11-25 session (serving); run from the repository root:

    python bench/experiments/2026-11-25-cpu-serve-fifth-session/page_faults.py

(quoted in bench/results/2026-11-25-cpu-serve/fifth-session/README.md).
"""
import io
import resource
import threading
import time

import numpy as np
import torch

from dmae_fast.bench.serve import Clients, ServeBenchConfig, ServerProcess, offline_rate
from dmae_fast.data import demo_digits


def npy(image: torch.Tensor) -> bytes:
    """A request body: the image as a .npy file (as dmae-bench serve sends it)."""
    buffer = io.BytesIO()
    np.save(buffer, image.numpy())
    return buffer.getvalue()


def minflt(pid):
    p=open(f"/proc/{pid}/stat").read().split(")")[1].split()
    return int(p[7])


def main() -> None:
    cfg = ServeBenchConfig()
    bodies = [npy(d) for d in demo_digits("test").images[:50]]
    srv = ServerProcess(cfg, 5.0)
    cl = Clients(srv, bodies, cfg.n)
    cl.closed_loop(32, 2)
    m0=srv.metrics()
    f0=minflt(srv.process.pid)
    cl.closed_loop(32, 6)
    m1=srv.metrics()
    f1=minflt(srv.process.pid)
    s=m1['dmae_serve_samples_total']-m0['dmae_serve_samples_total']
    print(f"server: {(f1-f0)/(s/1000):,.0f} minor faults per 1000 samples")
    srv.stop()
    # offline in this process (main thread) and in a non-main thread
    def measure():
        r0=resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t=time.perf_counter()
        rate=offline_rate(cfg)
        dt=time.perf_counter()-t
        r1=resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        return rate, (r1-r0)/(rate*dt/1000)
    torch.set_num_threads(2)
    print("offline main thread: %.0f samples/s, %.0f faults per 1000 samples (incl. setup)" % measure())
    print("offline main thread: %.0f samples/s, %.0f faults per 1000 samples (incl. setup)" % measure())
    out=[]
    th=threading.Thread(target=lambda: out.append(measure()))
    th.start()
    th.join()
    th=threading.Thread(target=lambda: out.append(measure()))
    th.start()
    th.join()
    for o in out:
        print("offline other thread: %.0f samples/s, %.0f faults per 1000 samples (incl. setup)" % o)


if __name__ == "__main__":
    main()
