"""Variant c (scores = K . q^T per position, M=C N=1): a block of T and each position alone, bitwise, at 1-4 threads."""
import numpy as np, onnxruntime as ort
from onnx import helper, TensorProto as P, numpy_helper
H,D=4,64
def sess(threads):
    f=lambda n,s:helper.make_tensor_value_info(n,P.FLOAT,s)
    inits=[numpy_helper.from_array(np.array([-3]),"m3"),numpy_helper.from_array(np.array([-1]),"m1")]
    nodes=[helper.make_node("Unsqueeze",["q","m1"],["qa"]),helper.make_node("Unsqueeze",["keys","m3"],["kb"]),
           helper.make_node("MatMul",["kb","qa"],["p"]),helper.make_node("Squeeze",["p","m1"],["scores"])]
    g=helper.make_graph(nodes,"g",[f("keys",None),f("q",None)],[f("scores",None)],initializer=inits)
    m=helper.make_model(g,opset_imports=[helper.make_opsetid("",17)])
    o=ort.SessionOptions(); o.intra_op_num_threads=threads
    return ort.InferenceSession(m.SerializeToString(),o,providers=["CPUExecutionProvider"])
rng=np.random.default_rng(1)
bad=0
for threads in (1,2,4):
    s=sess(threads)
    for B,T,C in [(1,7,16),(3,33,64),(17,8,64),(32,12,128),(5,20,256),(2,9,37)]:
        k=rng.standard_normal((B,H,C,D),dtype=np.float32); q=rng.standard_normal((B,H,T,D),dtype=np.float32)
        block=s.run(None,{"keys":k,"q":q})[0]
        for t in range(T):
            alone=s.run(None,{"keys":k,"q":q[:,:,t:t+1]})[0]
            if not np.array_equal(alone[:,:,0],block[:,:,t]): bad+=1; print("differs",threads,B,T,C,t)
print("mismatches", bad)
