"""Random test checkpoints (tests/reference/make_checkpoint.py) made once per module for each
(variant, dtype, options) and removed at the end (~13-26 MB each).

    @pytest.fixture(scope="module")
    def checkpoint(ckpt_root):
        yield from checkpoint_fixture(ckpt_root, prefix="tp", seed=7)
    ...
    model_dir = checkpoint("attnres_block", dtype="bf16", layers=7)
    other = checkpoint("attnres_block", seed=3)   # another seed than the module's
"""

import shutil

from make_checkpoint import make_checkpoint


def checkpoint_fixture(root, prefix: str, seed: int):
    made = {}

    def get(variant, dtype="f32", seed=seed, **options):
        key = (variant, dtype, seed, tuple(sorted(options.items())))
        if key not in made:
            name = "_".join(str(x) for x in (prefix, variant, dtype, seed, *sorted(options.items())))
            name = "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in name)
            made[key] = make_checkpoint(root / name, variant, seed=seed, dtype=dtype, **options)
        return made[key]

    yield get
    for path in made.values():
        shutil.rmtree(path, ignore_errors=True)
