import time, os, threading, resource
from dmae_fast.bench.serve import ServeBenchConfig, ServerProcess, Clients, _npy, offline_rate
from dmae_fast.data import demo_digits
import torch
cfg = ServeBenchConfig()
bodies = [_npy(d) for d in demo_digits("test").images[:50]]
def minflt(pid):
    p=open(f"/proc/{pid}/stat").read().split(")")[1].split(); return int(p[7])
srv = ServerProcess(cfg, 5.0)
cl = Clients(srv, bodies, cfg.n); cl.closed_loop(32, 2)
m0=srv.metrics(); f0=minflt(srv.process.pid); cl.closed_loop(32, 6); m1=srv.metrics(); f1=minflt(srv.process.pid)
s=m1['dmae_serve_samples_total']-m0['dmae_serve_samples_total']
print(f"server: {(f1-f0)/(s/1000):,.0f} minor faults per 1000 samples")
srv.stop()
# offline in this process (main thread) and in a non-main thread
from dmae_fast.memory import keep_freed_memory
def measure():
    r0=resource.getrusage(resource.RUSAGE_SELF).ru_minflt; t=time.perf_counter(); rate=offline_rate(cfg); dt=time.perf_counter()-t
    r1=resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    return rate, (r1-r0)/(rate*dt/1000)
torch.set_num_threads(2)
print("offline main thread: %.0f samples/s, %.0f faults per 1000 samples (incl. setup)" % measure())
print("offline main thread: %.0f samples/s, %.0f faults per 1000 samples (incl. setup)" % measure())
out=[]
th=threading.Thread(target=lambda: out.append(measure())); th.start(); th.join()
th=threading.Thread(target=lambda: out.append(measure())); th.start(); th.join()
for o in out: print("offline other thread: %.0f samples/s, %.0f faults per 1000 samples (incl. setup)" % o)
