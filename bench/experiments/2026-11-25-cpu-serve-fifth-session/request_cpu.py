"""CPU time per request on the server's HTTP side (threads other than the two batch threads), A/B of server variants.

Record of the fifth 2026-11-25 session (serving); run from the repository root:

    python bench/experiments/2026-11-25-cpu-serve-fifth-session/request_cpu.py NAME=VAR:VALUE,... [NAME=...]

Each argument starts one server with the given environment variables (``X_HTTP``/``X_LOOP`` were a
temporary switch of uvicorn's HTTP parser and event loop in that session, not kept; ``base=``
starts one as it is). Medians of 3 rounds of 6 s, 32 closed-loop clients (quoted in
bench/results/2026-11-25-cpu-serve/fifth-session/README.md).
"""
import glob
import io
import os
import statistics
import sys
import time

import numpy as np
import torch

from dmae_fast.bench.serve import Clients, ServeBenchConfig, ServerProcess
from dmae_fast.data import demo_digits


def npy(image: torch.Tensor) -> bytes:
    """A request body: the image as a .npy file (as dmae-bench serve sends it)."""
    buffer = io.BytesIO()
    np.save(buffer, image.numpy())
    return buffer.getvalue()


def tasks(pid):
    out={}
    for t in glob.glob(f"/proc/{pid}/task/*"):
        try:
            p=open(t+"/stat").read().split(")")[1].split()
            out[t]=(int(p[11])+int(p[12]))/os.sysconf("SC_CLK_TCK")
        except OSError:
            pass
    return out


def main() -> None:
    torch.set_num_threads(1)
    cfg = ServeBenchConfig()
    bodies = [npy(d) for d in demo_digits("test").images[:50]]
    variants={}
    for name, env in [(a.split("=")[0], dict(kv.split(":") for kv in a.split("=")[1].split(",") if kv))
                      for a in sys.argv[1:]]:
        for k in ("X_HTTP","X_LOOP"):
            os.environ.pop(k, None)
        os.environ.update(env)
        variants[name]=ServerProcess(cfg, 5.0)
    R={k:[] for k in variants}
    for r in range(3):
        for name, srv in variants.items():
            cl=Clients(srv, bodies, cfg.n)
            cl.closed_loop(32,1)
            a=tasks(srv.process.pid)
            t0=time.perf_counter()
            times=cl.closed_loop(32,6)
            dt=time.perf_counter()-t0
            b=tasks(srv.process.pid)
            d=[(b[k]-a.get(k,0))/dt for k in b]
            http=sum(x for x in d if x<0.3)
            R[name].append(http/ (len(times)/dt) *1e3)
            print(name, f"http-side cores {http:.3f}  req/s {len(times)/dt:.1f}  ms CPU/request {R[name][-1]:.2f}",
                  flush=True)
    for k,v in R.items():
        print(k, "median ms/request", round(statistics.median(v),2))
    for s in variants.values():
        s.stop()


if __name__ == "__main__":
    main()
