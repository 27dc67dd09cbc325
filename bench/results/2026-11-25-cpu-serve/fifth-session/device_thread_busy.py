import time, re, http.client, statistics
from dmae_fast.bench.serve import ServeBenchConfig, ServerProcess, Clients, _npy
from dmae_fast.data import demo_digits
import torch
torch.set_num_threads(1)
cfg = ServeBenchConfig()
bodies = [_npy(d) for d in demo_digits("test").images[:50]]
srv = ServerProcess(cfg, 5.0)
def m():
    c = http.client.HTTPConnection(srv.host, srv.port); c.request("GET", "/metrics"); t = c.getresponse().read().decode(); c.close()
    g = lambda n: float(re.search(rf"^{n} (\S+)$", t, re.M).group(1))
    return g("dmae_serve_batch_seconds_sum"), g("dmae_serve_batch_seconds_count"), g("dmae_serve_samples_total")
cl = Clients(srv, bodies, cfg.n); cl.closed_loop(32, 2)
for r in range(3):
    a = m(); t0 = time.perf_counter(); cl.closed_loop(32, 5); dt = time.perf_counter() - t0; b = m()
    print(f"busy {(b[0]-a[0])/dt:.3f}  ms/batch {(b[0]-a[0])/(b[1]-a[1])*1e3:.1f}  samples/s {(b[2]-a[2])/dt:,.0f}", flush=True)
srv.stop()
