"""Python stubs for proto/attnres/v1/*.proto, generated at import time with grpcio-tools into a
temporary folder (generated code is never committed), plus small client helpers for the gRPC
end-to-end tests.

    from grpc_stubs import pb, pb_grpc, health_pb, health_pb_grpc, GrpcServerProcess
"""

import atexit
import importlib
import shutil
import sys
import tempfile
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2 as health_pb  # noqa: F401 (re-exported)
from grpc_health.v1 import health_pb2_grpc as health_pb_grpc  # noqa: F401 (re-exported)
from grpc_tools import protoc

from server_process import ServerProcess

PROTO_ROOT = Path(__file__).resolve().parents[2] / "proto"


def _generate() -> Path:
    out = Path(tempfile.mkdtemp(prefix="attnres-grpc-stubs-"))
    atexit.register(shutil.rmtree, out, True)
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    # grpc_tools ships the well-known types (google/protobuf/*.proto) next to its module.
    well_known = Path(protoc.__file__).parent / "_proto"
    rc = protoc.main(["grpc_tools.protoc", f"-I{PROTO_ROOT}", f"-I{well_known}",
                      f"--python_out={out}", f"--grpc_python_out={out}", *protos])
    if rc != 0:
        raise RuntimeError(f"grpc_tools.protoc failed ({rc}) on {protos}")
    return out


sys.path.insert(0, str(_generate()))
pb = importlib.import_module("attnres.v1.generate_pb2")
pb_grpc = importlib.import_module("attnres.v1.generate_pb2_grpc")

# Every RPC in the tests has a deadline: a hung server fails the test instead of hanging it.
DEFAULT_TIMEOUT = 60.0


def channel(target: str) -> grpc.Channel:
    ch = grpc.insecure_channel(target)
    grpc.channel_ready_future(ch).result(timeout=DEFAULT_TIMEOUT)
    return ch


def collect(responses) -> dict:
    """Reads a whole Generate stream: per choice, the chunks' ids and text, the completion."""
    choices: dict[int, dict] = {}
    request_ids = set()
    for r in responses:
        request_ids.add(r.request_id)
        if r.HasField("chunk"):
            c = choices.setdefault(r.chunk.index, {"ids": [], "text": "", "chunks": 0,
                                                   "complete": None})
            assert c["complete"] is None, "a chunk arrived after its choice completed"
            c["ids"] += list(r.chunk.token_ids)
            c["text"] += r.chunk.text
            c["chunks"] += 1
        else:
            c = choices.setdefault(r.complete.index, {"ids": [], "text": "", "chunks": 0,
                                                      "complete": None})
            assert c["complete"] is None, "a choice completed twice"
            c["complete"] = r.complete
    return {"request_ids": request_ids, "choices": choices}


class GrpcServerProcess(ServerProcess):
    """Ready once HTTP /health is 200 (when HTTP is built) and gRPC health says SERVING: the
    gRPC port is bound after the HTTP one."""

    def health(self):
        http = super().health()
        if http not in (None, 200):
            return http
        try:
            with grpc.insecure_channel(self.grpc_target) as ch:
                reply = health_pb_grpc.HealthStub(ch).Check(health_pb.HealthCheckRequest(),
                                                            timeout=2)
            return 200 if reply.status == health_pb.HealthCheckResponse.SERVING else 503
        except grpc.RpcError:
            return None
