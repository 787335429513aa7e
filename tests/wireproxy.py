"""A MongoDB wire-protocol proxy on 127.0.0.1 that lets a test stop a client at
an exact request: the deterministic way to plant what a process killed
between two writes leaves behind, where a kill after a random delay only
finds the moment now and then.

It forwards whole messages both ways and reads only their command: the first
key of an OP_MSG body section (the wire format is MongoDB's, so the same
tests hold against any server). A rule matches one command on one
collection; when it fires it can

  - "kill_after_reply": let the request through, wait for the server's answer,
    then run the test's action (say, SIGKILL the client) before the answer is
    passed on, so the write is applied and the client never learns it;
  - "hold": keep the request back, run the action, and send it upstream only
    when release() is called, answer awaited: a write that lands after its
    sender died and someone else has looked at the state;
  - "pause": the same, but the client is still there: once released, the
    request and its answer go on as if nothing had happened (a slow backend
    at an exact point, say in the middle of a read).

Every rule fires once. Nothing here sleeps: waits are on events with deadlines.
"""
import socket
import struct
import threading

import bson

OP_MSG = 2013
DEADLINE = 30


def command_of(msg):
    """(command name, its value) of an OP_MSG, or (None, None) for anything else."""
    _, _, _, opcode = struct.unpack_from("<iiii", msg)
    if opcode != OP_MSG:
        return None, None
    pos = 20
    while pos < len(msg):
        kind = msg[pos]
        pos += 1
        size = struct.unpack_from("<i", msg, pos)[0]
        if kind == 0:
            doc = bson.decode(msg[pos:pos + size])
            for k, v in doc.items():
                return k, v
            return None, None
        pos += size
    return None, None


def read_msg(sock):
    head = b""
    while len(head) < 4:
        got = sock.recv(4 - len(head))
        if not got:
            return None
        head += got
    size = struct.unpack("<i", head)[0]
    body = bytearray(head)
    while len(body) < size:
        got = sock.recv(min(1 << 20, size - len(body)))
        if not got:
            return None
        body += got
    return bytes(body)


class Rule:
    def __init__(self, command, collection, how, action=None):
        self.command, self.collection, self.how, self.action = command, collection, how, action
        self.fired = threading.Event()      # the request was seen
        self.done = threading.Event()       # action run (kill_after_reply) or held write answered
        self.held = None                    # (upstream socket, message) while held
        self.release_now = threading.Event()

    def matches(self, cmd, value):
        return not self.fired.is_set() and cmd == self.command and value == self.collection

    def release(self):
        """Sends the held request upstream and waits until the server has answered it."""
        assert self.fired.wait(DEADLINE), f"{self.command} {self.collection} never came"
        self.release_now.set()
        assert self.done.wait(DEADLINE), "the held request got no answer"


class TcpProxy:
    """Listens on a port of 127.0.0.1 of its own and hands each client that
    connects to serve(client), on the accepting thread, until close(). The
    tests' proxies differ only in what they do with the bytes; a subclass
    sets up its own state before calling this __init__, which starts accepting."""

    def __init__(self, upstream_port, uri_options=""):
        self.upstream = ("127.0.0.1", upstream_port)
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.uri = f"mongodb://127.0.0.1:{self.port}/{uri_options}"
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self):
        self.listener.close()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            self.serve(client)

    def serve(self, client):
        raise NotImplementedError

    @staticmethod
    def pump(target, *args):
        """Runs target(*args) on a thread of its own, one per direction of a connection."""
        threading.Thread(target=target, args=args, daemon=True).start()


class WireProxy(TcpProxy):
    def __init__(self, upstream_port):
        self.rules = []
        self.lock = threading.Lock()
        super().__init__(upstream_port, "?directConnection=true")

    def add(self, rule):
        with self.lock:
            self.rules.append(rule)
        return rule

    def serve(self, client):
        server = socket.create_connection(self.upstream)
        pending = {}    # requestID -> rule waiting for its answer
        self.pump(self._up, client, server, pending)
        self.pump(self._down, server, client, pending)

    def _match(self, msg):
        cmd, value = command_of(msg)
        with self.lock:
            for r in self.rules:
                if r.matches(cmd, value):
                    r.fired.set()
                    return r
        return None

    def _up(self, client, server, pending):
        while True:
            try:
                msg = read_msg(client)
            except OSError:
                msg = None
            if msg is None:
                break
            rule = self._match(msg)
            if rule and rule.how == "hold":
                rule.held = (server, msg)
                if rule.action:
                    rule.action()
                rule.release_now.wait(DEADLINE * 4)
                pending[struct.unpack_from("<i", msg, 4)[0]] = rule
                server.sendall(msg)
                # The client is gone by now: the answer (see _down) is all we wait for.
                rule.done.wait(DEADLINE)
                break
            if rule and rule.how == "pause":
                if rule.action:
                    rule.action()
                rule.release_now.wait(DEADLINE * 4)
            if rule:
                pending[struct.unpack_from("<i", msg, 4)[0]] = rule
            try:
                server.sendall(msg)
            except OSError:
                break
        _close(client)
        _close(server)

    def _down(self, server, client, pending):
        while True:
            try:
                msg = read_msg(server)
            except OSError:
                msg = None
            if msg is None:
                break
            rule = pending.pop(struct.unpack_from("<i", msg, 8)[0], None)
            if rule and rule.how == "hold":
                rule.done.set()
                break
            if rule and rule.how == "pause":
                rule.done.set()
            if rule and rule.how == "kill_after_reply":
                if rule.action:
                    rule.action()
                rule.done.set()
                break
            try:
                client.sendall(msg)
            except OSError:
                break
        _close(client)
        _close(server)


def _close(sock):
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
