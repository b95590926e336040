"""python run_with_runtime.py RUNTIME_DIR SCRIPT ARGS...: run SCRIPT with aggdec.runtime from RUNTIME_DIR."""
import importlib.util, runpy, sys
root = sys.argv[1]
import aggdec
spec = importlib.util.spec_from_file_location("aggdec.runtime", f"{root}/__init__.py", submodule_search_locations=[root])
mod = importlib.util.module_from_spec(spec); sys.modules["aggdec.runtime"] = mod; aggdec.runtime = mod; spec.loader.exec_module(mod)
script = sys.argv[2]; sys.argv = sys.argv[2:]; sys.path.insert(0, script.rsplit("/", 1)[0])
runpy.run_path(script, run_name="__main__")
