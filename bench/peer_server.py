#!/usr/bin/env python3
"""The peer for bench/serve_bench.py: the kind of server the seed used, a
threaded Python HTTP/1.1 server reading GridFS through pymongo, no cache.

    bench/peer_server.py --uri URI --db DB --port PORT [--prefix P]

GET /NAME answers the newest revision of PREFIX/NAME (404 when missing).
"""
import argparse
import http.server
import socketserver
import urllib.parse

import gridfs
import pymongo


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    request_queue_size = 1024
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        pass  # clients hanging up when a benchmark ends are not news


def make_handler(bucket, prefix):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out in two writes: without TCP_NODELAY, Nagle
        # and delayed ACKs hold every response back 40 ms, which would make
        # the peer look far slower than such a server is.
        disable_nagle_algorithm = True

        def log_message(self, *args):
            pass

        def do_GET(self):
            path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
            name = prefix + path.lstrip("/")
            try:
                stream = bucket.open_download_stream_by_name(name)
            except gridfs.errors.NoFile:
                body = b"not found\n"
                self.send_response(404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            data = stream.read()
            self.send_response(200)
            self.send_header("Content-Type", "image/jpeg")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--uri", required=True)
    ap.add_argument("--db", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--prefix", default="")
    a = ap.parse_args()
    client = pymongo.MongoClient(a.uri, maxPoolSize=200)
    bucket = gridfs.GridFSBucket(client[a.db])
    prefix = a.prefix.rstrip("/") + "/" if a.prefix else ""
    Server(("127.0.0.1", a.port), make_handler(bucket, prefix)).serve_forever()


if __name__ == "__main__":
    main()
