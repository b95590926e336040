"""One self-attention layer's key write + score product, three ways, in-place bound buffer."""
import time, sys, numpy as np, onnxruntime as ort
from onnx import helper, TensorProto as P, numpy_helper
H,D=4,64
def model(variant,B,T,C):
    f=lambda n,s:helper.make_tensor_value_info(n,P.FLOAT,s); i=lambda n,s:helper.make_tensor_value_info(n,P.INT64,s)
    inits=[numpy_helper.from_array(np.array([-2]),"m2"),numpy_helper.from_array(np.array([-3]),"m3"),numpy_helper.from_array(np.array([-1]),"m1")]
    if variant=="a":
        nodes=[helper.make_node("ScatterND",["buf","idx","knew"],["keys"]),
               helper.make_node("Transpose",["keys"],["kt"],perm=[0,1,3,2]),
               helper.make_node("Unsqueeze",["q","m2"],["qa"]),helper.make_node("Unsqueeze",["kt","m3"],["kb"]),
               helper.make_node("MatMul",["qa","kb"],["p"]),helper.make_node("Squeeze",["p","m2"],["scores"])]
        ins=[f("buf",[B,H,C,D]),i("idx",[B,H,T,3]),f("knew",[B,H,T,D]),f("q",[B,H,T,D])]; kshape=[B,H,C,D]
    elif variant=="b":
        nodes=[helper.make_node("Transpose",["knew"],["knewt"],perm=[0,1,3,2]),
               helper.make_node("ScatterND",["buf","idx","knewt"],["keys"]),
               helper.make_node("Unsqueeze",["q","m2"],["qa"]),helper.make_node("Unsqueeze",["keys","m3"],["kb"]),
               helper.make_node("MatMul",["qa","kb"],["p"]),helper.make_node("Squeeze",["p","m2"],["scores"])]
        ins=[f("buf",[B,H,D,C]),i("idx",[B,H,D,T,4]),f("knew",[B,H,T,D]),f("q",[B,H,T,D])]; kshape=[B,H,D,C]
    else:  # c: K . q^T, M=C N=1
        nodes=[helper.make_node("ScatterND",["buf","idx","knew"],["keys"]),
               helper.make_node("Unsqueeze",["q","m1"],["qa"]),helper.make_node("Unsqueeze",["keys","m3"],["kb"]),
               helper.make_node("MatMul",["kb","qa"],["p"]),helper.make_node("Squeeze",["p","m1"],["scores"])]
        ins=[f("buf",[B,H,C,D]),i("idx",[B,H,T,3]),f("knew",[B,H,T,D]),f("q",[B,H,T,D])]; kshape=[B,H,C,D]
    g=helper.make_graph(nodes,"g",ins,[f("keys",kshape),f("scores",[B,H,T,C])],initializer=inits)
    m=helper.make_model(g,opset_imports=[helper.make_opsetid("",17)])
    o=ort.SessionOptions(); o.intra_op_num_threads=1
    return ort.InferenceSession(m.SerializeToString(),o,providers=["CPUExecutionProvider"]),kshape
def run(variant,B,T,C,n=400):
    rng=np.random.default_rng(0)
    s,kshape=model(variant,B,T,C)
    base=rng.random((B,H,C,D),dtype=np.float32)
    pos=rng.integers(0,C-T,size=B)
    q=rng.random((B,H,T,D),dtype=np.float32); knew=rng.random((B,H,T,D),dtype=np.float32)
    p=pos[:,None]+np.arange(T)[None]
    if variant=="b":
        idx=np.stack(np.broadcast_arrays(np.arange(B)[:,None,None,None],np.arange(H)[None,:,None,None],np.arange(D)[None,None,:,None],p[:,None,None,:]),-1)
        init=np.ascontiguousarray(base.transpose(0,1,3,2))
    else:
        idx=np.stack(np.broadcast_arrays(np.arange(B)[:,None,None],np.arange(H)[None,:,None],p[:,None,:]),-1); init=base
    buf=ort.OrtValue.ortvalue_from_numpy(init.copy())
    b=s.io_binding(); b.bind_ortvalue_input("buf",buf); b.bind_cpu_input("idx",np.ascontiguousarray(idx)); b.bind_cpu_input("knew",knew); b.bind_cpu_input("q",q)
    b.bind_ortvalue_output("keys",buf); b.bind_output("scores","cpu")
    s.run_with_iobinding(b); scores=b.copy_outputs_to_cpu()[1].copy(); keys=buf.numpy().copy()
    for _ in range(20): s.run_with_iobinding(b)
    t=time.perf_counter()
    for _ in range(n): s.run_with_iobinding(b)
    ms=(time.perf_counter()-t)/n*1e3
    if variant=="b": keys=keys.transpose(0,1,3,2)
    return ms,scores,keys,idx.nbytes
for B,T,C in [(1,1,32),(8,1,32),(17,1,64),(32,1,64),(17,8,64),(32,8,128)]:
    res={v:run(v,B,T,C) for v in "abc"}
    print(f"B{B} T{T} C{C}: " + " ".join(f"{v} {res[v][0]:.4f}ms" for v in "abc"),
          "b==a scores", np.array_equal(res['a'][1],res['b'][1]), "keys", np.array_equal(res['a'][2],res['b'][2]),
          "c==a", np.array_equal(res['a'][1],res['c'][1]), f"max|c-a| {np.abs(res['a'][1]-res['c'][1]).max():.1e}", flush=True)
    del res
