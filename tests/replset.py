"""Two embedded backends presented to a driver as one replica set: a test
harness for reads under readPreference=secondary (issue 31). No mongod runs
here, and FerretDB has no replication; what the product must get right is
what it asks of which member, and that the harness can show.

ReplicaSet(primary_port, secondary_port) listens on two ports of 127.0.0.1,
one per member (wireproxy.HelloRewriter each), and forwards every
connection to its backend unchanged but for hello's answer, which gets the
fields a replica set member reports (setName, hosts, primary, me,
isWritablePrimary/ismaster, secondary, setVersion, electionId on the
primary) so that the driver's SDAM sees a consistent set: every member
lists the same hosts under the address the driver reached it by ("me" must
equal that address, else the driver drops the member), and one claims to
be primary. The backend sends no topologyVersion, so the driver polls.

The two backends hold what the test writes into each with pymongo: the
secondary's copy of a bucket can lag the primary's (lack the newest files'
chunks), as a real secondary's can. Commands other than the handshake go
through as sent, with the read preference and read concern the driver adds;
`seen` records (member, command, collection, readConcern level) of each, so a
test can check which member served what.
"""
import socket
import threading

import bson

from wireproxy import HelloRewriter, decode_op_msg

SET_NAME = "rs0"
ELECTION_ID = bson.ObjectId("7fffffff0000000000000001")


class Member(HelloRewriter):
    """One member: hello rewritten, every other command recorded in rs.seen."""

    def __init__(self, rs, upstream_port, name):
        self.rs, self.name = rs, name
        super().__init__(upstream_port, {})
        self.address = f"127.0.0.1:{self.port}"

    def serve(self, client):
        server = socket.create_connection(self.upstream)
        self.pump(self._copy, client, server, self._record)
        self.pump(self._copy, server, client, self._rewrite)

    def _record(self, msg):
        doc = decode_op_msg(msg)
        if doc:
            name, target = next(iter(doc.items()))
            level = (doc.get("readConcern") or {}).get("level")
            with self.rs.lock:
                self.rs.seen.append((self.name, name, target, level))
        return msg


class ReplicaSet:
    def __init__(self, primary_port, secondary_port):
        self.lock = threading.Lock()
        self.seen = []
        self.primary = Member(self, primary_port, "primary")
        self.secondary = Member(self, secondary_port, "secondary")
        hosts = [self.primary.address, self.secondary.address]
        for m in (self.primary, self.secondary):
            is_primary = m is self.primary
            m.extra.update({"setName": SET_NAME, "setVersion": 1, "hosts": hosts,
                            "primary": self.primary.address, "me": m.address,
                            "ismaster": is_primary, "isWritablePrimary": is_primary,
                            "secondary": not is_primary})
            if is_primary:
                m.extra["electionId"] = ELECTION_ID

    def uri(self, read_preference="secondary"):
        hosts = f"{self.primary.address},{self.secondary.address}"
        return (f"mongodb://{hosts}/?replicaSet={SET_NAME}&readPreference={read_preference}"
                "&heartbeatFrequencyMS=500")

    def served(self, member, command=None):
        """Commands (name, collection, readConcern level) the member answered."""
        with self.lock:
            return [(c, t, lv) for m, c, t, lv in self.seen if m == member and c == (command or c)]

    def close(self):
        self.primary.close()
        self.secondary.close()
