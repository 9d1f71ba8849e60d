"""Dense BF16 GEMM rates and SM clocks under load on one GPU, the control for ``moe_bench.py``
(needs PyTorch and CUDA; not part of the test suite).  Committed run: ``data/h200_gemm_ref.json``
on an H200 (700 W), ``python3 gemm_ref_bench.py OUT.json``.  Two rounds over mamf-finder's
best H100/H200 shape (2048 x 2048 x 13312), MoE expert shapes and Llama-70B-like shapes:
median and best of 50 calls after 10 warm-up calls, with nvidia-smi's SM clock and power
read after each shape.  Rows: [round, name, m, n, k, median TFLOP/s, best TFLOP/s, clock and power].
"""
import json,sys,torch,subprocess
D,B="cuda",torch.bfloat16
def T(fn,n=50):
    for _ in range(10):fn()
    torch.cuda.synchronize();ts=[]
    for _ in range(n):
        a,b=torch.cuda.Event(enable_timing=True),torch.cuda.Event(enable_timing=True);a.record();fn();b.record();b.synchronize();ts.append(a.elapsed_time(b)/1e3)
    ts.sort();return ts[n//2],ts[0]
out=[]
for rnd in range(2):
  for nm,(m,n,k) in (("mamf_ref",(2048,2048,13312)),("q30_fc1",(131072,1536,2048)),("dsv3_fc1",(32768,4096,7168)),("oss_fc1",(65536,5760,2880)),("sq8192",(8192,8192,8192)),("llama70_fc1",(8192,57344,8192)),("llama70_qkv",(8192,10240,8192))):
    A=torch.randn(m,k,device=D,dtype=B);W=torch.randn(k,n,device=D,dtype=B)
    med,best=T(lambda:torch.mm(A,W));fl=2.*m*n*k
    clk=subprocess.run(["nvidia-smi","--query-gpu=clocks.sm,power.draw","--format=csv,noheader"],capture_output=True,text=True).stdout.strip()
    out.append([rnd,nm,m,n,k,fl/med/1e12,fl/best/1e12,clk]);print(rnd,nm,round(fl/med/1e12),round(fl/best/1e12),clk,flush=True)
json.dump(out,open(sys.argv[1],"w"))
