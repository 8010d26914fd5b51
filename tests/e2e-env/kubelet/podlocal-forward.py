#!/usr/bin/env python3
"""podlocal-forward: loopback ports between a pod's isolated network and the node's, for pods that
must not use hostNetwork (a namespace enforcing the "restricted" Pod Security Standard) but talk to
the test's API servers, which listen on the node's 127.0.0.1 only.

  podlocal-forward.py NETNS PID_DIR NAME --in PORT[,PORT...] --out PORT[,PORT...]

  --in PORT   listens on 127.0.0.1:PORT inside the pod's network namespace NETNS and connects each
              connection to 127.0.0.1:PORT of the node (an API server);
  --out PORT  listens on 127.0.0.1:PORT of the node and connects each connection to 127.0.0.1:PORT
              inside the pod (its health endpoint, for the kubelet's probe and the test's curl).

Traffic stays on loopback: the node's 127.0.0.1 and the pod's own, in a namespace the test's
containerd made. cni-podlocal.py starts it on ADD for the namespaces its config names and stops it
on DEL. It records itself as PID_DIR/NAME.{pid,exe,start} (kl-lib.sh's format) once every listener
is bound, so kubelet-node-down.sh stops a leftover one like any other process of the node.
"""
import errno
import ctypes
import os
import socket
import sys
import threading

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def enter(ns_fd):
    """Moves the calling thread (only it) into the network namespace ns_fd."""
    if _libc.setns(ns_fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, "setns: " + os.strerror(err))


def pump(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        src.close()


def in_netns(ns_fd, make):
    """make() run in a thread of its own inside ns_fd (when given): a socket it
    creates lives in that namespace, and no other thread moves."""
    result = {}

    def run():
        try:
            if ns_fd is not None:
                enter(ns_fd)
            result["sock"] = make()
        except OSError as e:
            result["error"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in result:
        raise result["error"]
    return result["sock"]


def connect(port, ns_fd):
    """A connection to 127.0.0.1:port, made from inside ns_fd when given."""
    def make():
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.settimeout(None)
        return s
    return in_netns(ns_fd, make)


def serve(listener, port, ns_fd):
    while True:
        client, _ = listener.accept()
        try:
            upstream = connect(port, ns_fd)
        except OSError as e:
            print("connect 127.0.0.1:%d: %s" % (port, e), file=sys.stderr, flush=True)
            client.close()
            continue
        threading.Thread(target=pump, args=(client, upstream), daemon=True).start()
        threading.Thread(target=pump, args=(upstream, client), daemon=True).start()


def listen(port, ns_fd):
    """A listener on 127.0.0.1:port, bound inside ns_fd when given."""
    def make():
        if ns_fd is not None:
            # containerd brings the pod's loopback up; not necessarily before this runs.
            os.system("ip link set lo up 2>/dev/null")
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen(64)
        return s
    return in_netns(ns_fd, make)


def ports(arg):
    return [int(p) for p in arg.split(",") if p]


def main():
    netns, pid_dir, name = sys.argv[1:4]
    opts = dict(zip(sys.argv[4::2], sys.argv[5::2]))
    ns_fd = os.open(netns, os.O_RDONLY)
    servers = []
    for port in ports(opts.get("--in", "")):
        servers.append((listen(port, ns_fd), port, None))
    for port in ports(opts.get("--out", "")):
        try:
            servers.append((listen(port, None), port, ns_fd))
        except OSError as e:
            # The node's port already leads into another pod of these namespaces (the
            # controller's liveness port, whose kubelet probe it serves); a second pod there
            # (a helm test pod) needs the way in, not this way out.
            if e.errno != errno.EADDRINUSE:
                raise
            print("out %d: taken on the node by another pod; not forwarded for %s" % (port, netns), flush=True)
    for listener, port, target in servers:
        threading.Thread(target=serve, args=(listener, port, target), daemon=True).start()
    stat = open("/proc/self/stat").read()
    start = stat[stat.rindex(")") + 2:].split()[19]
    base = os.path.join(pid_dir, name)
    with open(base + ".exe", "w") as f:
        f.write(os.path.realpath("/proc/self/exe") + "\n")
    with open(base + ".start", "w") as f:
        f.write(start + "\n")
    with open(base + ".pid.tmp", "w") as f:
        f.write("%d\n" % os.getpid())
    os.rename(base + ".pid.tmp", base + ".pid")
    print("forwarding in=%s out=%s for %s" % (opts.get("--in", ""), opts.get("--out", ""), netns), flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
