#!/usr/bin/env python3
"""Runs a fixture script of this folder once per build and copies its folder where asked.

    cached_fixture.py CACHE_DIR OUT SCRIPT [ARGS...]

Makes OUT as `/usr/bin/python3 SCRIPT OUT ARGS...` would, but the script runs only when
CACHE_DIR holds no folder made by the same arguments and the same scripts; otherwise OUT is a
copy of that folder. The fixture scripts import PyTorch (about 1.8 s a process on this
machine's cores) and the suite asks for the same ~50 fixtures about 140 times from its test
processes and multi-process scripts.

The key is a hash of SCRIPT's arguments and of every .py file of this folder (a script may
import the others); the fixtures are seeded, so one made earlier is the one the script would
make now. An empty CACHE_DIR runs the script every time. Processes started at once (ctest -j)
wait for each other on a lock per key instead of making the same folder twice; a folder is
published by renaming it, so an interrupted run leaves nothing that looks finished.
"""
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def key(script, args):
    h = hashlib.sha256()
    h.update(os.path.realpath(sys.executable).encode() + b"\0")
    h.update("\0".join([script] + args).encode() + b"\0")
    for name in sorted(os.listdir(HERE)):
        if name.endswith(".py"):
            with open(os.path.join(HERE, name), "rb") as f:
                h.update(name.encode() + b"\0" + f.read())
    return h.hexdigest()[:24]


def run(out, script, args):
    subprocess.run([sys.executable, os.path.join(HERE, script), out] + args, check=True)


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    cache, out, script, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    if not cache:
        run(out, script, args)
        return
    os.makedirs(cache, exist_ok=True)
    made = os.path.join(cache, f"{os.path.splitext(script)[0]}-{key(script, args)}")
    if not os.path.isdir(made):
        with open(made + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not os.path.isdir(made):  # another process may have made it meanwhile
                tmp = f"{made}.tmp{os.getpid()}"
                shutil.rmtree(tmp, ignore_errors=True)
                try:
                    run(tmp, script, args)
                    os.rename(tmp, made)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
    if os.path.exists(out):
        shutil.rmtree(out)
    shutil.copytree(made, out)


if __name__ == "__main__":
    main()
