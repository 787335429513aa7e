"""Two embedded backends presented to a driver as one replica set: a test
harness for reads under readPreference=secondary (issue 31). No mongod runs
here, and FerretDB has no replication; what the product must get right is
what it asks of which member, and that the harness can show.

ReplicaSet(primary_port, secondary_port) listens on two ports of 127.0.0.1,
one per member, and forwards every connection to its backend unchanged but
for the answers to the handshake and monitoring commands (hello, isMaster,
legacy ismaster, by OP_MSG or OP_QUERY): those get the fields a replica set
member reports (setName, hosts, primary, me, isWritablePrimary/ismaster,
secondary, setVersion, electionId on the primary) so that the driver's SDAM
sees a consistent set: every member lists the same hosts under the address
the driver reached it by ("me" must equal that address, else the driver
drops the member), and one claims to be primary. topologyVersion is dropped:
without it the driver polls, which the proxy answers the same way each time.

The two backends hold what the test writes into each with pymongo: the
secondary's copy of a bucket can lag the primary's (lack the newest files'
chunks), as a real secondary's can. Commands other than the handshake go
through as sent, with the read preference and read concern the driver adds;
`seen` records (member, command, collection, readConcern level) of each, so a
test can check which member served what.
"""
import struct
import threading

import bson

from wireproxy import OP_MSG, TcpProxy, decode_op_msg, read_msg

OP_REPLY = 1
OP_QUERY = 2004
HELLO = ("hello", "ismaster", "isMaster")
SET_NAME = "rs0"
ELECTION_ID = bson.ObjectId("7fffffff0000000000000001")


def _cstring_end(msg, pos):
    return msg.index(b"\0", pos)


def hello_request(msg):
    """Whether msg asks hello/isMaster, by OP_MSG or by the legacy OP_QUERY."""
    opcode = struct.unpack_from("<i", msg, 12)[0]
    if opcode == OP_MSG:
        doc = decode_op_msg(msg) or {}
    elif opcode == OP_QUERY:
        end = _cstring_end(msg, 20)
        doc = bson.decode(msg[end + 1 + 8:])   # after the name: numberToSkip, numberToReturn
    else:
        return False
    return bool(doc) and next(iter(doc)) in HELLO


def _rewrite_reply(msg, change):
    """msg (an OP_MSG or OP_REPLY answer) with its one document passed through change()."""
    request_id, response_to, opcode = struct.unpack_from("<iii", msg, 4)
    if opcode == OP_MSG:
        flags = struct.unpack_from("<I", msg, 16)[0] & ~1   # any checksum no longer holds
        size = struct.unpack_from("<i", msg, 21)[0]
        body = bson.encode(change(bson.decode(msg[21:21 + size])))
        payload = struct.pack("<I", flags) + b"\0" + body
    elif opcode == OP_REPLY:
        head = msg[16:36]
        size = struct.unpack_from("<i", msg, 36)[0]
        payload = head + bson.encode(change(bson.decode(msg[36:36 + size])))
    else:
        return msg
    return struct.pack("<iiii", 16 + len(payload), request_id, response_to, opcode) + payload


class Member(TcpProxy):
    def __init__(self, rs, upstream_port, name):
        self.rs, self.name = rs, name
        super().__init__(upstream_port)

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"

    def serve(self, client):
        import socket
        server = socket.create_connection(self.upstream)
        hellos = set()
        self.pump(self._up, client, server, hellos)
        self.pump(self._down, server, client, hellos)

    def _up(self, client, server, hellos):
        while True:
            msg = _read(client)
            if msg is None:
                break
            if hello_request(msg):
                hellos.add(struct.unpack_from("<i", msg, 4)[0])
            else:
                doc = decode_op_msg(msg)
                if doc:
                    name, target = next(iter(doc.items()))
                    level = (doc.get("readConcern") or {}).get("level")
                    with self.rs.lock:
                        self.rs.seen.append((self.name, name, target, level))
            if not _send(server, msg):
                break
        _shut(client, server)

    def _down(self, server, client, hellos):
        while True:
            msg = _read(server)
            if msg is None:
                break
            to = struct.unpack_from("<i", msg, 8)[0]
            if to in hellos:
                hellos.discard(to)
                msg = _rewrite_reply(msg, self.rs.member_reply(self))
            if not _send(client, msg):
                break
        _shut(client, server)


def _read(sock):
    try:
        return read_msg(sock)
    except OSError:
        return None


def _send(sock, msg):
    try:
        sock.sendall(msg)
        return True
    except OSError:
        return False


def _shut(*socks):
    for s in socks:
        try:
            s.close()
        except OSError:
            pass


class ReplicaSet:
    def __init__(self, primary_port, secondary_port):
        self.lock = threading.Lock()
        self.seen = []
        self.primary = Member(self, primary_port, "primary")
        self.secondary = Member(self, secondary_port, "secondary")

    def uri(self, read_preference="secondary"):
        hosts = f"{self.primary.address},{self.secondary.address}"
        return (f"mongodb://{hosts}/?replicaSet={SET_NAME}&readPreference={read_preference}"
                "&heartbeatFrequencyMS=500")

    def member_reply(self, member):
        is_primary = member is self.primary

        def change(doc):
            doc.pop("topologyVersion", None)
            doc.pop("isreplicaset", None)
            doc.update({
                "setName": SET_NAME,
                "setVersion": 1,
                "hosts": [self.primary.address, self.secondary.address],
                "primary": self.primary.address,
                "me": member.address,
                "ismaster": is_primary,
                "isWritablePrimary": is_primary,
                "secondary": not is_primary,
            })
            if is_primary:
                doc["electionId"] = ELECTION_ID
            return doc
        return change

    def served(self, member, command=None):
        """Commands (name, collection, readConcern level) the member answered."""
        with self.lock:
            return [(c, t, lv) for m, c, t, lv in self.seen if m == member and c == (command or c)]

    def close(self):
        self.primary.close()
        self.secondary.close()
