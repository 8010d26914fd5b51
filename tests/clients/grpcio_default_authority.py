"""A gRPC C-core client (Python grpcio) with its default settings on the
driver's unix socket: the authority it sends is the socket path."""
import sys

import grpc

socket = sys.argv[1]
with grpc.insecure_channel("unix:" + socket) as channel:
    info = channel.unary_unary("/csi.v1.Identity/GetPluginInfo")(b"", timeout=10)
    assert b"relay.csi.dev" in info, info
    for _ in range(3):  # later calls reuse the compression context
        channel.unary_unary("/csi.v1.Identity/Probe")(b"", timeout=10)
    try:
        channel.unary_unary("/csi.v1.Controller/CreateVolume")(b"", timeout=10)
        raise SystemExit("CreateVolume without a name was accepted")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
        assert "name" in e.details(), e.details()
print("ok")
