"""How busy the server's device thread is: ``dmae_serve_batch_seconds`` over wall time, 32 closed-loop clients.

Record of the fifth 2026-11-25 session (serving); run from the repository root:

    python bench/experiments/2026-11-25-cpu-serve-fifth-session/device_thread_busy.py

(quoted in bench/results/2026-11-25-cpu-serve/fifth-session/README.md).
"""
import http.client
import io
import re
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


def main() -> None:
    torch.set_num_threads(1)
    cfg = ServeBenchConfig()
    bodies = [npy(d) for d in demo_digits("test").images[:50]]
    srv = ServerProcess(cfg, 5.0)
    def m():
        c = http.client.HTTPConnection(srv.host, srv.port)
        c.request("GET", "/metrics")
        t = c.getresponse().read().decode()
        c.close()

        def g(n):
            return float(re.search(rf"^{n} (\S+)$", t, re.M).group(1))

        return g("dmae_serve_batch_seconds_sum"), g("dmae_serve_batch_seconds_count"), g("dmae_serve_samples_total")
    cl = Clients(srv, bodies, cfg.n)
    cl.closed_loop(32, 2)
    for r in range(3):
        a = m()
        t0 = time.perf_counter()
        cl.closed_loop(32, 5)
        dt = time.perf_counter() - t0
        b = m()
        print(f"busy {(b[0]-a[0])/dt:.3f}  ms/batch {(b[0]-a[0])/(b[1]-a[1])*1e3:.1f}  "
              f"samples/s {(b[2]-a[2])/dt:,.0f}", flush=True)
    srv.stop()


if __name__ == "__main__":
    main()
