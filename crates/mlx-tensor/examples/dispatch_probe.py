"""The Python side of `examples/dispatch-probe.rs`: the same chain of adds, timed per node.
  python3 crates/mlx-tensor/examples/dispatch_probe.py [n] [rounds]"""
import sys, time, json
import mlx.core as mx
n = int(sys.argv[1]) if len(sys.argv) > 1 else 1600
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 20
x = mx.zeros((1, 4096), dtype=mx.bfloat16); one = mx.array(1.0, dtype=mx.bfloat16); mx.eval(x, one)
b, d, w = [], [], []
for _ in range(rounds):
    t0 = time.perf_counter(); y = x
    for _ in range(n): y = y + one
    t1 = time.perf_counter(); mx.async_eval(y); t2 = time.perf_counter(); y.item() if y.size == 1 else mx.eval(y); t3 = time.perf_counter()
    b.append((t1-t0)*1e6/n); d.append((t2-t1)*1e6/n); w.append((t3-t2)*1e6/n)
med = lambda v: sorted(v)[len(v)//2]
print(json.dumps({"engine": "python", "nodes": n, "build_us_per_node": round(med(b),3), "dispatch_us_per_node": round(med(d),3), "wait_us_per_node": round(med(w),3)}))
