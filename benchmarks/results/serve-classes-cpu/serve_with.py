"""aggdec serve with the CPU profile's length classes replaced (argv[1]: comma list), for an A/B."""
import sys
import aggdec.runtime.tuning as t
classes = tuple(int(x) for x in sys.argv[1].split(",") if x)
t.PROFILES["cpu"] = t.PROFILES["cpu"].replace(length_classes=classes)
print("length classes", t.tuning_for("cpu").length_classes, file=sys.stderr, flush=True)
from aggdec.cli import main
sys.argv = ["aggdec"] + sys.argv[2:]
raise SystemExit(main())
