"""Shared, generic fixtures for the Python tests.

- repo_root:   the repository root
- build_dir:   $ATTNRES_BUILD_DIR, default <repo>/build
- attnres_bin: <build_dir>/server/cli/attnres (existence is checked by the tests that
               need it, so that a missing binary FAILS those tests instead of skipping)
- ckpt_root:   a session-scoped temporary directory for generated checkpoints
- client:      the official openai client against the module's `server` fixture
- model_name:  the model id that server lists first in /v1/models
"""

import os
import sys
from pathlib import Path

import pytest

from http_helpers import openai_client, served_model_name

REPO_ROOT = Path(__file__).resolve().parents[2]

# The reference implementation and the checkpoint generator live in tests/reference.
sys.path.insert(0, str(REPO_ROOT / "tests" / "reference"))


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def build_dir() -> Path:
    return Path(os.environ.get("ATTNRES_BUILD_DIR", REPO_ROOT / "build")).resolve()


@pytest.fixture(scope="session")
def attnres_bin(build_dir) -> Path:
    return build_dir / "server" / "cli" / "attnres"


@pytest.fixture(scope="session")
def ckpt_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("checkpoints")


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server.http_url)


@pytest.fixture(scope="module")
def model_name(server) -> str:
    return served_model_name(server.http_url)
