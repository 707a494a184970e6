"""Streaming generation over AttnRes Serve's gRPC API (proto/attnres/v1/generate.proto) with
grpcio: prints the text as the tokens arrive, then the finish reason, the token ids and the
usage. Ctrl-C cancels the call, and the server aborts the request.

    pip install grpcio grpcio-tools
    attnres serve                      # gRPC on 127.0.0.1:50051 (the built-in demo model)
    python clients/python/grpc_generate.py --target 127.0.0.1:50051 \
        --prompt "Attention residuals" --max-tokens 32

The Python stubs are generated from proto/ at start-up with grpcio-tools into a temporary
folder (nothing generated is kept); --proto-dir points elsewhere when this script is copied
out of the repository. --api-key (or $ATTNRES_API_KEY) only when the server has one.
"""

import argparse
import importlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

import grpc
from grpc_tools import protoc

DEFAULT_PROTO_DIR = Path(__file__).resolve().parents[2] / "proto"


def load_stubs(proto_dir: Path):
    """Generates generate_pb2 / generate_pb2_grpc from proto_dir into a temporary folder."""
    proto = proto_dir / "attnres" / "v1" / "generate.proto"
    if not proto.is_file():
        sys.exit(f"grpc_generate.py: {proto} not found (use --proto-dir)")
    out = tempfile.mkdtemp(prefix="attnres-stubs-")
    rc = protoc.main(["grpc_tools.protoc", f"-I{proto_dir}", f"--python_out={out}",
                      f"--grpc_python_out={out}", str(proto.relative_to(proto_dir))])
    if rc != 0:
        sys.exit(f"grpc_generate.py: protoc failed on {proto}")
    sys.path.insert(0, out)
    try:
        pb = importlib.import_module("attnres.v1.generate_pb2")
        pb_grpc = importlib.import_module("attnres.v1.generate_pb2_grpc")
    finally:
        shutil.rmtree(out, ignore_errors=True)  # the modules are loaded; the files can go
    return pb, pb_grpc


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target",
                        default=os.environ.get("ATTNRES_GRPC_TARGET", "127.0.0.1:50051"),
                        help="the server's gRPC address (default: $ATTNRES_GRPC_TARGET, else "
                             "127.0.0.1:50051)")
    parser.add_argument("--api-key", default=os.environ.get("ATTNRES_API_KEY"))
    parser.add_argument("--prompt", default="Attention residuals let each layer")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--request-id", default="", help="default: the server makes one")
    parser.add_argument("--timeout", type=float, default=600.0, help="deadline in seconds")
    parser.add_argument("--proto-dir", type=Path, default=DEFAULT_PROTO_DIR)
    return parser.parse_args()


def generate(stub, pb, args, metadata) -> int:
    info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=args.timeout, metadata=metadata)
    print(f"model: {info.served_model_name} ({info.model_type}, "
          f"attnres_mode {info.attnres_mode}, max_model_len {info.max_model_len})")

    params = pb.SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens)
    if args.seed is not None:
        params.seed = args.seed
    request = pb.GenerateRequest(request_id=args.request_id, text=args.prompt,
                                 sampling_params=params, stream=True)
    call = stub.Generate(request, timeout=args.timeout, metadata=metadata)
    request_id, complete = None, None
    try:
        for response in call:
            request_id = response.request_id
            if response.HasField("chunk"):
                sys.stdout.write(response.chunk.text)  # the text that became final
                sys.stdout.flush()
            else:
                complete = response.complete  # one per choice, after its chunks
    except KeyboardInterrupt:
        call.cancel()  # the server aborts the request and frees its KV cache
        print("\ninterrupted: request cancelled", file=sys.stderr)
        return 130
    print()
    print(f"request_id: {request_id}")
    print(f"finish_reason: {complete.finish_reason}")
    print(f"token_ids: {list(complete.output_ids)}")
    usage = complete.usage
    print(f"usage: prompt {usage.prompt_tokens}, completion {usage.completion_tokens}, "
          f"total {usage.total_tokens}")
    return 0


def main() -> int:
    args = parse_args()
    pb, pb_grpc = load_stubs(args.proto_dir)
    metadata = [("authorization", f"Bearer {args.api_key}")] if args.api_key else None
    with grpc.insecure_channel(args.target) as channel:
        try:
            return generate(pb_grpc.GenerateStub(channel), pb, args, metadata)
        except grpc.RpcError as error:  # the status code and the server's message
            print(f"\ngrpc_generate.py: {error.code().name}: {error.details()}", file=sys.stderr)
            return 1


if __name__ == "__main__":
    sys.exit(main())
