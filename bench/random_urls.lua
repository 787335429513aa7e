-- wrk script: every request asks for a path picked at random from the file
-- named by $URLS (one path per line, already percent-encoded), and done()
-- prints one JSON line the bench driver parses.
local paths = {}

function init(args)
  for line in io.lines(os.getenv("URLS")) do
    paths[#paths + 1] = line
  end
  math.randomseed(os.time() + tonumber(tostring({}):sub(8), 16))
end

function request()
  return wrk.format("GET", paths[math.random(#paths)])
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"bytes":%d,"p50_us":%d,"p99_us":%d,' ..
    '"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d}\n',
    summary.requests, summary.duration, summary.bytes,
    latency:percentile(50), latency:percentile(99),
    e.connect, e.read, e.write, e.status, e.timeout))
end
