import os, runpy, sys
from aggdec.export import quantize as Q
if os.environ.get("A7"):
    Q.ROW_QMAX = 63.0; Q.A_ZERO_POINT = 64
sys.argv = ["var2"] + sys.argv[1:]
runpy.run_path("/tmp/mti8/var2.py", run_name="__main__")
