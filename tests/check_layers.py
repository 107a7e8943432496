#!/usr/bin/env python3
"""The layering, checked: every project header a library's file includes belongs to that
library or to one it links (directly or through its public links), and no library reaches
above its layer. Reads the libraries' links from the CMakeLists themselves, so the check
follows the build; the table below only says which files each library owns and its layer.

    tests/check_layers.py [source-dir]        exit 0 when the tree holds its layering
"""
import re
import sys
from pathlib import Path

# library -> (layer, owned paths: a folder ending in '/' or a file stem). A path is owned by
# the library with the longest matching entry, so the seams inside model/ and the NCCL
# communicator inside parallel/ are their own libraries.
LIBRARIES = {
    "dhp_core": (0, ["core/"]),
    "dhp_types": (0, ["types/"]),
    "dhp_kernels": (1, ["kernels/"]),
    "dhp_cuda": (2, ["kernels/cuda/"]),
    "dhp_model_seams": (2, ["model/attention_seam", "model/image_route"]),
    "dhp_data_core": (1, ["data/presets"]),
    "dhp_data": (2, ["data/"]),
    "dhp_model": (3, ["model/"]),
    "dhp_parallel": (3, ["parallel/"]),
    "dhp_nccl": (4, ["parallel/nccl_comm"]),
    "dhp_trainer": (5, ["trainer/"]),
    "dhp_app": (6, ["app/"]),
    "dhp": (7, ["app/main"]),  # the executable
}
SOURCES = (".h", ".cpp", ".cu", ".cuh", ".inc")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
LINK = re.compile(r"target_link_libraries\(\s*(\w+)([^)]*)\)", re.S)


def owner(path):
    best, best_len = None, -1
    for lib, (_, entries) in LIBRARIES.items():
        for e in entries:
            hit = path.startswith(e) if e.endswith("/") else path.rsplit(".", 1)[0] == e
            if hit and len(e) > best_len:
                best, best_len = lib, len(e)
    return best


def links(root):
    """Direct dhp_* links of each library, as the CMakeLists say (PRIVATE ones count for the
    library's own files, PUBLIC and INTERFACE ones also for its users)."""
    own, public = {}, {}
    for cm in root.rglob("CMakeLists.txt"):
        if "build" in cm.relative_to(root).parts[0]:
            continue
        for lib, body in LINK.findall(cm.read_text()):
            if lib not in LIBRARIES:
                continue
            scope = "PUBLIC"
            for word in body.split():
                if word in ("PUBLIC", "PRIVATE", "INTERFACE"):
                    scope = word
                elif word in LIBRARIES:
                    own.setdefault(lib, set()).add(word)
                    if scope != "PRIVATE":
                        public.setdefault(lib, set()).add(word)
    return own, public


def reachable(lib, own, public):
    seen, todo = set(), list(own.get(lib, ()))
    while todo:
        x = todo.pop()
        if x not in seen:
            seen.add(x)
            todo.extend(public.get(x, ()))
    return seen


def main():
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent)
    own, public = links(root)
    problems, edges = [], {}
    for lib, (layer, _) in LIBRARIES.items():
        for dep in own.get(lib, ()):
            if LIBRARIES[dep][0] >= layer:
                problems.append(f"{lib} (layer {layer}) links {dep} (layer {LIBRARIES[dep][0]}): not below it")
    for f in sorted(root.rglob("*")):
        rel = f.relative_to(root).as_posix()
        if f.suffix not in SOURCES or rel.split("/")[0] in ("tests", "bench") or rel.startswith("build"):
            continue
        lib = owner(rel)
        if lib is None:
            problems.append(f"{rel}: belongs to no library of the table")
            continue
        allowed = reachable(lib, own, public) | {lib}
        for inc in INCLUDE.findall(f.read_text(errors="replace")):
            target = owner(inc)
            if target is None or not (root / inc).exists():
                continue
            edges.setdefault((lib, target), 0)
            edges[(lib, target)] += 1
            if target not in allowed:
                problems.append(f"{rel}: includes {inc} of {target}, which {lib} does not link")
    for (a, b), n in sorted(edges.items()):
        if a != b:
            print(f"  {a} -> {b}: {n} includes")
    for p in problems:
        print("layering:", p)
    print(f"{len(problems)} include edges or links against the layering")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
