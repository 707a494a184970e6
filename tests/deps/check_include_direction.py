#!/usr/bin/env python3
"""Checks which folder may include which: the engine knows no backend, no front end and no
client; the clients know no server; the kernels know no front end; and inside engine/ every
library includes only the layers below it (docs/ARCHITECTURE.md, "Folders, and which way
they may depend").

    engine/   must not include kernels/, server/, clients/ or tests/
    kernels/  must not include server/, clients/ or tests/
    clients/  must not include server/ or tests/
    server/   must not include tests/

    engine/core       includes no other engine/ folder
    engine/jinja      engine/core
    engine/tokenizer  engine/core, jinja
    engine/sample     engine/core
    engine/parallel   engine/core (the communicators: no model, no runner, no scheduler)
    engine/model      engine/core, parallel, sample, tokenizer, jinja
    engine/runner     engine/core, parallel, model, sample, tokenizer, jinja
    engine/sched      engine/core, model, runner, sample, tokenizer, jinja (tensor parallelism
                      only through the runners: not engine/parallel)

An engine/ folder missing from that table is itself reported, so a new one gets a place.
Every #include "..." or <...> whose path starts with one of those folders counts, in every
C/C++/CUDA source under the checked folders. Exits 1 listing each offending line.

    tests/deps/check_include_direction.py [--root DIR]   # DIR: a checkout (default: this one)
    tests/deps/check_include_direction.py --self-test    # the rules catch planted includes
    git show REV:PATH | tests/deps/check_include_direction.py --stdin PATH   # one old file

Run by ctest as include_direction and include_direction_self_test (tests/CMakeLists.txt).
"""
import argparse
import pathlib
import re
import sys
import tempfile

FORBIDDEN = {
    "engine": ("kernels", "server", "clients", "tests"),
    "kernels": ("server", "clients", "tests"),
    "clients": ("server", "tests"),
    "server": ("tests",),
}
# engine/<folder> -> the engine/ folders it may include (besides its own).
ENGINE_LAYERS = {
    "core": (),
    "jinja": ("core",),
    "tokenizer": ("core", "jinja"),
    "sample": ("core",),
    "parallel": ("core",),
    "model": ("core", "parallel", "sample", "tokenizer", "jinja"),
    "runner": ("core", "parallel", "model", "sample", "tokenizer", "jinja"),
    "sched": ("core", "model", "runner", "sample", "tokenizer", "jinja"),
}
SOURCE_SUFFIXES = {".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh", ".inc"}
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')


def engine_folder(path: str):
    """The folder under engine/ of a repository path or include ("engine/model/x.h" -> "model");
    None for anything else."""
    parts = path.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "engine" else None


def violations_in_text(rel_path: str, text: str):
    top = rel_path.split("/", 1)[0]
    banned = FORBIDDEN.get(top, ())
    layer = engine_folder(rel_path)
    if layer is not None and layer not in ENGINE_LAYERS:
        yield (f"{rel_path}:0: engine/{layer}/ has no place in the layer order "
               "(ENGINE_LAYERS in tests/deps/check_include_direction.py)")
        return
    for number, line in enumerate(text.splitlines(), 1):
        match = INCLUDE.match(line)
        if not match:
            continue
        target = match.group(1)
        target_top = target.split("/", 1)[0]
        if target_top in banned:
            yield f"{rel_path}:{number}: {top}/ must not include {target_top}/: {line.strip()}"
        target_layer = engine_folder(target)
        if (layer is not None and target_layer is not None and target_layer != layer
                and target_layer not in ENGINE_LAYERS[layer]):
            yield (f"{rel_path}:{number}: engine/{layer}/ must not include "
                   f"engine/{target_layer}/ (a layer above it or beside it): {line.strip()}")


def violations(root: pathlib.Path):
    for top in FORBIDDEN:
        base = root / top
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            if path.suffix in SOURCE_SUFFIXES and path.is_file():
                rel = path.relative_to(root).as_posix()
                yield from violations_in_text(rel, path.read_text(errors="replace"))


def self_test() -> int:
    """Plants one forbidden include per rule (and allowed ones) and checks what is reported."""
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        planted = {
            "engine/parallel/nccl.cpp": '#include "kernels/cuda/cuda_backend.h"\n',
            "engine/sched/x.h": "#include <server/cli/flags.h>\n",
            "engine/core/y.cpp": ' #  include "clients/bench/metrics.h"\n',
            "clients/cpp/cli/main.cpp": '#include "server/cli/flags.h"\n',
            "kernels/cpu/z.cpp": '#include "server/common/metrics.h"\n',
            "kernels/cuda/w.cu": '#include "clients/cpp/client.h"\n',
            # The engine's layers, both directions of the old sched <-> parallel cycle included.
            "engine/parallel/p.h": '#include "engine/sched/model_runner.h"\n',
            "engine/parallel/q.cpp": '#include "engine/sched/engine_args.h"\n',
            "engine/sched/s.cpp": '#include "engine/parallel/communicator.h"\n',
            "engine/parallel/r.h": '#include "engine/runner/model_runner.h"\n',
            "engine/model/m.h": '#include "engine/runner/model_runner.h"\n',
            "engine/runner/n.h": '#include <engine/sched/engine_args.h>\n',
            "engine/core/c.h": '#include "engine/model/transformer.h"\n',
            "engine/sample/t.cpp": '#include "engine/tokenizer/tokenizer.h"\n',
            "engine/newlayer/u.cpp": '#include "engine/core/error.h"\n',
        }
        allowed = {
            "kernels/cpu/ok.cpp": '#include "engine/core/backend.h"\n',
            "server/cli/ok.cpp": '#include "kernels/cpu/cpu_backend.h"\n#include "clients/x.h"\n',
            "clients/cpp/ok.cpp": '#include "engine/core/error.h"\n',
            "engine/core/ok.h": '// #include "kernels/cpu/cpu_backend.h" (a comment)\n',
            "engine/sched/ok.cpp": '#include "engine/runner/model_runner.h"\n'
                                   '#include "engine/model/loaded_model.h"\n',
            "engine/runner/ok.cpp": '#include "engine/parallel/communicator.h"\n'
                                    '#include "engine/model/transformer.h"\n',
            "engine/model/ok.h": '#include "engine/parallel/communicator.h"\n'
                                 '#include "engine/model/kv_cache.h"\n',
            "engine/parallel/ok.h": '#include "engine/core/backend.h"\n#include <vector>\n',
        }
        for rel, text in {**planted, **allowed}.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        found = sorted(v.split(":", 1)[0] for v in violations(root))
        if found != sorted(planted):
            print(f"self-test FAILED: reported {found}, expected {sorted(planted)}")
            return 1
    print(f"self-test passed: {len(planted)} planted violations reported, allowed includes not")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=pathlib.Path,
                        default=pathlib.Path(__file__).resolve().parents[2])
    parser.add_argument("--self-test", action="store_true")
    parser.add_argument("--stdin", metavar="REL_PATH",
                        help="check the text on stdin as the file REL_PATH of the repository")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    if args.stdin:
        found = list(violations_in_text(args.stdin, sys.stdin.read()))
    else:
        found = list(violations(args.root.resolve()))
    for line in found:
        print(line)
    if found:
        print(f"{len(found)} include(s) against the dependency direction "
              "(tests/deps/check_include_direction.py says which folder may include which)")
        return 1
    print("include direction: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
