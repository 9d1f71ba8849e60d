"""MoE-layer microbenchmarks on one GPU (needs PyTorch and CUDA; not part of the test suite).

Run on an H200 (PyTorch 2.11+cu130) for the committed ``data/h200_moe.json``:
``python3 moe_bench.py OUT.json``.  BF16, short runs (median of 20 after 5 warm-up calls).

* ``mem``: achieved bytes/s over the datasheet HBM rate ``H`` (4.8 TB/s) of the memory-bound
  kernels around the experts at the per-rank shapes of the Blackwell set's MoE models
  (``S``: name, hidden, expert width, local experts, tokens per expert): a copy, a row
  gather by index (the token permutation), ``index_add_`` (a scatter-add unpermutation;
  Megatron runs Transformer Engine's fused kernel instead), an unfused SwiGLU (bytes counted
  as one fused pass) and PyTorch's RMSNorm.  Rows: [shape, kernel, bytes, seconds, fraction].
* ``gemm``: the expert GEMMs as one cuBLAS GEMM per expert issued back to back, as one GEMM
  over all the rank's tokens, and as ``torch._grouped_mm``: fc1 and fc2 forward and the fc1
  weight gradient (tokens are K).  Rows: [shape, gemm, experts, m, n, k, FLOPs, loop s,
  one-GEMM s, grouped s].

The compact form is the one that ran (it was sent to the GPU machine inline).
"""
import json,sys,torch,torch.nn.functional as F
S=[("q30 ep8 mbs4",2048,768,16,8192),("q30 ep8 mbs1",2048,768,16,2048),("q235 ep32",4096,1536,4,8192),("dsv3 ep64",7168,2048,4,8192),("oss ep64",2880,2880,2,32768),("nano ep8",2688,1856,16,6144)]
D,B="cuda",torch.bfloat16
R=lambda *s:torch.randn(*s,device=D,dtype=B)
def T(fn,n=20):
    for _ in range(5):fn()
    torch.cuda.synchronize();ts=[]
    for _ in range(n):
        a,b=torch.cuda.Event(enable_timing=True),torch.cuda.Event(enable_timing=True);a.record();fn();b.record();b.synchronize();ts.append(a.elapsed_time(b)/1e3)
    return sorted(ts)[n//2]
out={"dev":torch.cuda.get_device_name(),"torch":torch.__version__,"mem":[],"gemm":[]}
H=4.8e12
for nm,h,f,e,t in S:
    r=t*e;x=R(r,h);i=torch.randint(0,r,(r,),device=D);s=R(r,h);tk=r//8;j=torch.randint(0,tk,(r,),device=D);ac=torch.zeros(tk,h,device=D,dtype=B);g=R(r,2*f);w=torch.ones(h,device=D,dtype=B)
    for k,by,fn in (("copy",4*x.numel(),lambda:x.clone()),("gather",4*x.numel()+8*r,lambda:x.index_select(0,i)),("index_add",2*s.numel()+4*ac.numel()+8*r,lambda:ac.index_add_(0,j,s)),("swiglu",3*g.numel(),lambda:F.silu(g[:,:f])*g[:,f:]),("rmsnorm",4*x.numel(),lambda:F.rms_norm(x,(h,),w))):
        tt=T(fn);out["mem"].append([nm,k,by,tt,by/tt/H]);print(nm,k,round(by/tt/H,3),flush=True)
for nm,h,f,e,t in S:
    for gm,(m,n,k) in (("fc1",(t,2*f,h)),("fc2",(t,h,f)),("wg1",(h,2*f,t))):
        xs=[R(m,k) for _ in range(e)];ws=[R(k,n) for _ in range(e)]
        if gm=="wg1":A,Bm=R(m,k*e),R(k*e,n)
        else:A,Bm=R(m*e,k),ws[0]
        fl=2.*m*n*k*e;lp=T(lambda:[torch.mm(a,b) for a,b in zip(xs,ws)]);one=T(lambda:torch.mm(A,Bm));gr=None
        if gm!="wg1" and hasattr(torch,"_grouped_mm"):
            try:
                a2=torch.cat(xs);w2=torch.stack([q.t().contiguous().t() for q in ws]);of=torch.arange(1,e+1,device=D,dtype=torch.int32)*m;gr=T(lambda:torch._grouped_mm(a2,w2,offs=of))
            except Exception as ex:gr=str(ex)[:80]
        row=[nm,gm,e,m,n,k,fl,lp,one,gr];out["gemm"].append(row);print(nm,gm,round(fl/lp/1e12),round(fl/one/1e12),gr if not isinstance(gr,float) else round(fl/gr/1e12),flush=True)
json.dump(out,open(sys.argv[1],"w"))
