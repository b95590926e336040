"""Files for the lent GPU machine, carried in calls of at most 64 MiB each, and put back together there.

The device tool sends the working tree with every call (about 31 MiB here) plus the ignored
paths the call names in ``carry``, 64 MiB in all, and the machine keeps its /tmp only while it
stays warm between calls. So what does not fit beside the tree (onnxruntime-gpu's 256 MB
wheel, the larger reference checkpoint) is split into folders ``w1 .. wN``, one carried per
call; each holds one part and ``pack.json`` (the whole file's name, sha256 and number of
parts). On the device, :func:`stage` copies whatever parts a call carried into
``WORK/stage/NAME/`` and, once every part of a file is there and its sha256 matches, installs
it: a wheel into ``WORK/site`` (put first on PYTHONPATH by check.sh, ahead of the image's CPU
onnxruntime), a ``.tar.gz`` pack into ``WORK/carried/NAME/``.

onnxruntime-gpu's parts are the ones ``../shared/tools/ort-gpu-chunks.sh`` makes in
``.ort-gpu/w*/`` (``describe-wheel`` adds their pack.json); everything else is packed here
(``pack``) into ``.gpu-pack/NAME/w*/``. Both folders are git-ignored, so they travel only when
a call names them in ``carry``.

    python benchmarks/gpu/carry.py pack NAME PATH... [--room-mib N] [--wheels]  # CPU side: .gpu-pack/NAME/w1..wN
    python benchmarks/gpu/carry.py describe-wheel [.ort-gpu]          # CPU side: pack.json beside each part
    python benchmarks/gpu/carry.py stage --work DIR                   # device side, at the start of every call

This module uses the standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

PACK_FILE = "pack.json"
PART_PREFIX = "part"  # part00, part01, ...: the names `split -d -a 2` gives (ort-gpu-chunks.sh)
PACK_ROOT = Path(".gpu-pack")
WHEEL_ROOT = Path(".ort-gpu")
# what may travel with a call, and the share ort-gpu-chunks.sh leaves for the rest (its 62 MiB)
CALL_LIMIT_MIB, SPLIT_LIMIT_MIB = 64, 62
# what a site pack's first part shares its call with: the data pack (180 kB) and a margin
SITE_MARGIN_MIB = 1
MIB = 1024 * 1024


class CarryError(Exception):
    """A pack that cannot be made or put back together; the message says which and why."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(MIB), b""):
            digest.update(block)
    return digest.hexdigest()


def tree_bytes(root: Path) -> int:
    """Bytes of what every call sends: tracked files and untracked files git does not ignore."""
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, check=True).stdout.split(b"\0")
    return sum((root / name.decode()).stat().st_size for name in listed if name and (root / name.decode()).is_file())


def room_mib(root: Path, limit_mib: int = SPLIT_LIMIT_MIB) -> int:
    """MiB a call can carry beside the tree: of ``limit_mib`` (ort-gpu-chunks.sh's 62 by default)."""
    return (limit_mib * MIB - tree_bytes(root)) // MIB


def split_file(path: Path, out_root: Path, chunk_bytes: int, description: dict) -> list[Path]:
    """``path`` cut into ``out_root/w1 .. wN``, one ``partNN`` each, with ``description`` plus the
    whole file's name, sha256 and number of parts in each folder's pack.json."""
    if chunk_bytes < 1:
        raise CarryError(f"no room to carry a part of {path.name} (chunk size {chunk_bytes} bytes)")
    size = path.stat().st_size
    parts = max(1, -(-size // chunk_bytes))
    if parts > 100:
        raise CarryError(f"{path.name} would need {parts} parts; the part names have two digits")
    if out_root.exists():
        shutil.rmtree(out_root)
    info = {**description, "file": path.name, "bytes": size, "sha256": sha256_file(path), "parts": parts}
    folders = []
    with path.open("rb") as handle:
        for index in range(parts):
            folder = out_root / f"w{index + 1}"
            folder.mkdir(parents=True)
            (folder / f"{PART_PREFIX}{index:02d}").write_bytes(handle.read(chunk_bytes))
            (folder / PACK_FILE).write_text(json.dumps(info, indent=1) + "\n")
            folders.append(folder)
    return folders


def pack(name: str, sources: list[Path], chunk_bytes: int, root: Path = PACK_ROOT, wheels: bool = False) -> list[Path]:
    """Files and folders ``sources`` as one ``NAME.tar.gz`` (each under its own base name), split
    into parts of ``chunk_bytes`` in ``root/NAME/w1..wN``; returns the folders to carry, in order.
    ``wheels``: the device installs every wheel in it into WORK/site once it is unpacked."""
    if wheels and not any(s.suffix == ".whl" or any(s.rglob("*.whl")) for s in sources if s.exists()):
        raise CarryError(f"--wheels: no .whl among {', '.join(map(str, sources))}")
    for source in sources:
        if not source.exists():
            raise CarryError(f"{source} does not exist")
    work = root / f".{name}.build"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    archive = work / f"{name}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for source in sources:
            tar.add(source, arcname=source.name)
    try:
        description = {"name": name, "kind": "tar", **({"install": "wheels"} if wheels else {})}
        return split_file(archive, root / name, chunk_bytes, description)
    finally:
        shutil.rmtree(work)


def pack_site(name: str, archive: Path, chunk_bytes: int, root: Path = PACK_ROOT) -> list[Path]:
    """A site folder packed as one archive (slim_ort.py's onnxruntime-gpu), split into
    ``root/NAME/w1..wN``; the device unpacks it into WORK/site once every part is there."""
    if not archive.is_file():
        raise CarryError(f"{archive} does not exist")
    return split_file(archive, root / name, chunk_bytes, {"name": name, "kind": "site"})


def describe_wheel(root: Path = WHEEL_ROOT) -> list[Path]:
    """pack.json in each of ort-gpu-chunks.sh's folders (root/w1..wN), from the wheel it split
    (root/dl/*.whl): the device then knows how many parts make the wheel and its sha256."""
    wheels = sorted((root / "dl").glob("*.whl"))
    if len(wheels) != 1:
        raise CarryError(f"expected one wheel in {root / 'dl'}, found {len(wheels)}: run ../shared/tools/ort-gpu-chunks.sh")
    folders = sorted((p for p in root.glob("w[0-9]*") if p.is_dir()), key=lambda p: int(p.name[1:]))
    if not folders:
        raise CarryError(f"no part folders in {root}: run ../shared/tools/ort-gpu-chunks.sh")
    wheel = wheels[0]
    info = {"name": wheel.name.split("-")[0].replace("_", "-"), "kind": "wheel", "file": wheel.name,
            "bytes": wheel.stat().st_size, "sha256": sha256_file(wheel), "parts": len(folders)}
    for folder in folders:
        (folder / PACK_FILE).write_text(json.dumps(info, indent=1) + "\n")
    return folders


# ------------------------------------------------------------------ the device side


def carried_folders(repo: Path) -> list[Path]:
    """The part folders this call carried (any w* folder with a pack.json under .ort-gpu or .gpu-pack)."""
    found = [p.parent for p in (repo / WHEEL_ROOT).glob(f"w*/{PACK_FILE}")]
    found += [p.parent for p in (repo / PACK_ROOT).glob(f"*/w*/{PACK_FILE}")]
    return sorted(found)


def _pip_target(wheels: list[Path], site: Path) -> None:
    """Install ``wheels`` into ``site`` from no index and without their dependencies (the image
    has no index; a missing dependency is carried as a wheel of its own)."""
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                           "--upgrade", "--target", str(site), *map(str, wheels)], capture_output=True, text=True)
    if done.returncode != 0:
        raise CarryError(f"pip could not install {', '.join(w.name for w in wheels)}: {done.stderr.strip()[-600:]}")


def _extract(archive: Path, target: Path) -> None:
    if not hasattr(tarfile, "data_filter"):
        raise CarryError("unpacking a carried archive needs tarfile's data filter (Python 3.10.12, 3.11.4, 3.12 or later)")
    with tarfile.open(archive) as tar:  # any compression tarfile knows (.tar.gz packs, slim_ort.py's .tar.xz)
        tar.extractall(target, filter="data")  # "data": no links out, no absolute paths, no devices


def _install(info: dict, whole: Path, work: Path) -> str:
    site = work / "site"
    if info["kind"] == "wheel":
        _pip_target([whole], site)
        return f"installed into {site}"
    if info["kind"] == "site":  # a package laid out as pip installs it (slim_ort.py): unpacked into the site
        site.mkdir(parents=True, exist_ok=True)
        _extract(whole, site)
        return f"unpacked into {site}"
    target = work / "carried" / info["name"]
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    _extract(whole, target)
    if info.get("install") == "wheels":  # a pack of wheels (pack --wheels): installed like onnxruntime-gpu
        wheels = sorted(target.rglob("*.whl"))
        if not wheels:
            raise CarryError(f"the pack {info['name']} holds no wheel")
        _pip_target(wheels, site)
        return f"{len(wheels)} wheel(s) installed into {site}"
    return f"extracted into {target}"


def stage(repo: Path, work: Path) -> dict:
    """Copy the parts this call carried into WORK/stage, and install each file whose parts are
    all there. Returns, per file, its state: which parts are there, and what was done."""
    states: dict[str, dict] = {}
    for folder in carried_folders(repo):
        info = json.loads((folder / PACK_FILE).read_text())
        place = work / "stage" / info["name"]
        place.mkdir(parents=True, exist_ok=True)
        previous = place / PACK_FILE
        if previous.is_file() and json.loads(previous.read_text())["sha256"] != info["sha256"]:
            shutil.rmtree(place)  # parts of another version of this file: start again
            place.mkdir(parents=True)
        for part in folder.glob(f"{PART_PREFIX}*"):
            shutil.copyfile(part, place / part.name)
        (place / PACK_FILE).write_text(json.dumps(info, indent=1) + "\n")
    for place in sorted((work / "stage").glob(f"*/{PACK_FILE}")):
        place = place.parent
        info = json.loads((place / PACK_FILE).read_text())
        wanted = [f"{PART_PREFIX}{i:02d}" for i in range(info["parts"])]
        present = [name for name in wanted if (place / name).is_file()]
        state = {"file": info["file"], "parts": info["parts"], "present": len(present)}
        marker = place / "INSTALLED"
        if marker.is_file() and marker.read_text().split("\n", 1)[0] == info["sha256"]:
            state["state"], state["present"] = marker.read_text().split("\n", 1)[1].strip(), info["parts"]
        elif len(present) < len(wanted):
            missing = [str(int(name[len(PART_PREFIX):]) + 1) for name in wanted if name not in present]
            state["state"] = f"waiting for part(s) {', '.join(missing)} (folders w{', w'.join(missing)})"
        else:
            whole = place / info["file"]
            with whole.open("wb") as out:
                for name in wanted:
                    with (place / name).open("rb") as part:
                        shutil.copyfileobj(part, out)
            if sha256_file(whole) != info["sha256"]:
                whole.unlink()
                state["state"] = "sha256 mismatch: the parts are not the file they were cut from; carry them again"
                state["error"] = True
            else:
                try:
                    state["state"] = _install(info, whole, work)
                    marker.write_text(info["sha256"] + "\n" + state["state"] + "\n")
                    for name in wanted:  # done with: the marker says so from now on
                        (place / name).unlink()
                except CarryError as exc:
                    state["state"], state["error"] = str(exc), True
                whole.unlink()
        states[info["name"]] = state
    return states


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    packing = sub.add_parser("pack", help="CPU side: pack files into .gpu-pack/NAME/w1..wN")
    packing.add_argument("name")
    packing.add_argument("paths", nargs="+", type=Path)
    packing.add_argument("--room-mib", type=int, help="MiB per part (default: what fits beside the tree)")
    packing.add_argument("--wheels", action="store_true", help="the device installs the wheels in it into WORK/site")
    site = sub.add_parser("pack-site", help="CPU side: a site archive (slim_ort.py) into .gpu-pack/NAME/w1..wN")
    site.add_argument("name")
    site.add_argument("archive", type=Path)
    site.add_argument("--room-mib", type=int, help="MiB per part (default: what fits beside the tree in a call, "
                      "less 1 MiB for the data pack)")
    describe = sub.add_parser("describe-wheel", help="CPU side: pack.json for ort-gpu-chunks.sh's folders")
    describe.add_argument("root", nargs="?", type=Path, default=WHEEL_ROOT)
    staging = sub.add_parser("stage", help="device side: gather carried parts, install complete files")
    staging.add_argument("--work", type=Path, required=True)
    staging.add_argument("--repo", type=Path, default=Path("."))
    args = parser.parse_args(argv)
    try:
        if args.command == "pack":
            room = args.room_mib if args.room_mib is not None else room_mib(Path("."))
            folders = pack(args.name, args.paths, room * MIB, wheels=args.wheels)
            print(f"{args.name}: {len(folders)} folder(s) to carry, one per call: "
                  + " ".join(str(f) for f in folders))
        elif args.command == "pack-site":
            # the whole call but the margin: the slimmed onnxruntime-gpu (58 MiB) then fits in two
            # parts beside a 34 MiB tree, where ort-gpu-chunks.sh's 62 MiB would make three
            room = (args.room_mib if args.room_mib is not None
                    else room_mib(Path("."), CALL_LIMIT_MIB - SITE_MARGIN_MIB))
            folders = pack_site(args.name, args.archive, room * MIB)
            print(f"{args.name}: {len(folders)} folder(s) to carry, one per call: "
                  + " ".join(str(f) for f in folders))
        elif args.command == "describe-wheel":
            folders = describe_wheel(args.root)
            print(f"{len(folders)} wheel part folder(s) described: " + " ".join(str(f) for f in folders))
        else:
            args.work.mkdir(parents=True, exist_ok=True)
            states = stage(args.repo, args.work)
            (args.work / "staging.json").write_text(json.dumps(states, indent=1) + "\n")
            for name, state in states.items():
                print(f"carried {name}: {state['present']}/{state['parts']} part(s); {state['state']}")
            if not states:
                print("carried: nothing staged (no .ort-gpu/w*/ or .gpu-pack/*/w*/ folder with a pack.json)")
            return 1 if any(s.get("error") for s in states.values()) else 0
    except CarryError as exc:
        print(f"carry.py: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
