"""A MongoDB wire-protocol proxy on 127.0.0.1 that lets a test stop a client at
an exact request: the deterministic way to plant what a process killed
between two writes leaves behind, where a kill after a random delay only
finds the moment now and then.

It forwards whole messages both ways and reads their command: the first key
of an OP_MSG body section (the wire format is MongoDB's, so the same tests
hold against any server). A rule matches one command on one collection;
when it fires it can

  - "kill_after_reply": let the request through, wait for the server's answer,
    then run the test's action (say, SIGKILL the client) before the answer is
    passed on, so the write is applied and the client never learns it;
  - "hold": keep the request back, run the action, and send it upstream only
    when release() is called, answer awaited: a write that lands after its
    sender died and someone else has looked at the state;
  - "pause": the same, but the client is still there: once released, the
    request and its answer go on as if nothing had happened (a slow backend
    at an exact point, say in the middle of a read).

Every rule fires once. FreezingProxy, on the same listener, stops answering at
a command's bytes: a server frozen mid-request. Nothing here sleeps: waits are
on events with deadlines.

CommandRecorder keeps every command its clients send, decoded whole
(decode_op_msg: the body and its document sequences), with the time its
answer took: what a verb asks of the server, to check against the query rule
of docs/design.md.
"""
import socket
import struct
import threading
import time

import bson

OP_MSG = 2013
OP_REPLY = 1
DEADLINE = 30


def decode_op_msg(msg):
    """The command an OP_MSG carries, as one document: its body (section kind
    0) with each document sequence (kind 1: "documents" of an insert,
    "deletes", "updates") as a list under its identifier, as the server reads
    it. None for any other opcode."""
    _, _, _, opcode = struct.unpack_from("<iiii", msg)
    if opcode != OP_MSG:
        return None
    flags = struct.unpack_from("<I", msg, 16)[0]
    end = len(msg) - (4 if flags & 1 else 0)   # checksumPresent: a CRC-32C ends the message
    pos, body, sequences = 20, None, {}
    while pos < end:
        kind = msg[pos]
        pos += 1
        size = struct.unpack_from("<i", msg, pos)[0]
        if kind == 0:
            body = bson.decode(msg[pos:pos + size])
        elif kind == 1:
            cstring_end = msg.index(b"\0", pos + 4)
            ident = msg[pos + 4:cstring_end].decode()
            sequences[ident] = bson.decode_all(msg[cstring_end + 1:pos + size])
        pos += size
    if body is None:
        return None
    body.update(sequences)
    return body


def command_of(msg):
    """(command name, its value) of an OP_MSG, or (None, None) for anything else."""
    doc = decode_op_msg(msg)
    for k, v in (doc or {}).items():
        return k, v
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


class FreezingProxy(TcpProxy):
    """Forwards TCP to the backend until a client sends `trigger`; from then on it
    forwards nothing on any connection (the trigger included) and accepts new ones
    without answering: what a SIGSTOPped server looks like from the client."""

    def __init__(self, backend_port, trigger):
        self.trigger = trigger
        self.frozen = threading.Event()
        self.closed = threading.Event()
        self.socks = []
        super().__init__(backend_port)

    def serve(self, client):
        self.socks.append(client)
        if self.frozen.is_set():
            return
        server = socket.create_connection(self.upstream)
        self.socks.append(server)
        self.pump(self._pump, client, server, True)
        self.pump(self._pump, server, client, False)

    def _pump(self, src, dst, watch):
        tail = b""
        try:
            while not self.frozen.is_set() and (data := src.recv(65536)):
                if watch and self.trigger in tail + data:
                    self.frozen.set()
                tail = (tail + data)[-len(self.trigger):]
                if self.frozen.is_set():
                    break
                dst.sendall(data)
        except OSError:
            pass
        self.closed.wait()  # frozen: hold the connection open, answer nothing

    def close(self):
        self.closed.set()
        for s in [self.listener] + self.socks:
            try:
                s.close()
            except OSError:
                pass


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


class HelloRewriter(TcpProxy):
    """Forwards every connection unchanged but for hello's answer (the one
    reply that carries maxWireVersion, in OP_MSG or the handshake's
    OP_REPLY), into which it merges extra: one server that says it is a
    replica set member (setName, hosts, primary) or a mongos (msg:
    "isdbgrid"), for what a client makes of that. Every other command and
    answer is the backend's own."""

    def __init__(self, upstream_port, extra):
        self.extra = extra
        super().__init__(upstream_port, "?directConnection=true")

    def serve(self, client):
        server = socket.create_connection(self.upstream)
        self.pump(self._copy, client, server, None)
        self.pump(self._copy, server, client, self._rewrite)

    @staticmethod
    def _copy(src, dst, rewrite):
        try:
            while (msg := read_msg(src)) is not None:
                dst.sendall(rewrite(msg) if rewrite else msg)
        except OSError:
            pass
        _close(src)
        _close(dst)

    def _merged(self, raw):
        doc = bson.decode(raw)
        if "maxWireVersion" not in doc:
            return None
        doc.update(self.extra)
        return bson.encode(doc)

    def _rewrite(self, msg):
        _, req, resp, opcode = struct.unpack_from("<iiii", msg)
        if opcode == OP_MSG:
            flags = struct.unpack_from("<I", msg, 16)[0]
            if flags & 1 or msg[20] != 0:
                return msg  # a checksum, or no body first: not a reply this rewrites
            size = struct.unpack_from("<i", msg, 21)[0]
            body = self._merged(msg[21:21 + size])
            if body is None:
                return msg
            payload = struct.pack("<I", flags) + b"\0" + body + msg[21 + size:]
        elif opcode == OP_REPLY:
            head = msg[16:36]
            if struct.unpack_from("<i", head, 16)[0] != 1:
                return msg
            body = self._merged(msg[36:])
            if body is None:
                return msg
            payload = head + body
        else:
            return msg
        return struct.pack("<iiii", 16 + len(payload), req, resp, opcode) + payload


def _close(sock):
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


class Command:
    """One command a client sent: its name, the collection (or other value)
    it names, its database, the whole decoded document, and the seconds
    between the request and its answer (None until answered)."""

    def __init__(self, doc):
        self.name, self.target = next(iter(doc.items())) if doc else (None, None)
        self.db, self.doc, self.seconds = doc.get("$db"), doc, None

    def __repr__(self):
        shown = {k: v for k, v in self.doc.items() if k not in ("documents", "lsid", "$clusterTime")}
        return f"{self.name} {self.db}.{self.target} {shown}"


class CommandRecorder(TcpProxy):
    """Forwards every connection to the backend unchanged and records each
    command (a Command) in the order the proxy read them, across connections."""

    def __init__(self, upstream_port):
        self.commands = []
        self.lock = threading.Lock()
        super().__init__(upstream_port, "?directConnection=true")

    def serve(self, client):
        server = socket.create_connection(self.upstream)
        asked = {}   # requestID -> (Command, monotonic time sent)
        self.pump(self._up, client, server, asked)
        self.pump(self._down, server, client, asked)

    def _up(self, client, server, asked):
        try:
            while (msg := read_msg(client)) is not None:
                doc = decode_op_msg(msg)
                if doc is not None:
                    cmd = Command(doc)
                    with self.lock:
                        self.commands.append(cmd)
                    asked[struct.unpack_from("<i", msg, 4)[0]] = (cmd, time.monotonic())
                server.sendall(msg)
        except OSError:
            pass
        _close(client)
        _close(server)

    def _down(self, server, client, asked):
        try:
            while (msg := read_msg(server)) is not None:
                cmd, sent = asked.pop(struct.unpack_from("<i", msg, 8)[0], (None, None))
                if cmd is not None:
                    cmd.seconds = time.monotonic() - sent
                client.sendall(msg)
        except OSError:
            pass
        _close(client)
        _close(server)

    def taken(self):
        """The commands recorded so far, and a fresh start."""
        with self.lock:
            cmds, self.commands = self.commands, []
        return cmds
