-- Threadline for HAProxy (2.6 and later, Lua 5.3): send each request about a thread
-- to the gateway that owns the thread's partition, so that it is served there and
-- not forwarded between gateways (docs/scaling.md, "An owner-aware load balancer").
--
--   global
--       lua-load /etc/haproxy/threadline.lua
--   backend gateways
--       balance roundrobin
--       http-request lua.threadline_owner
--       use-server g0 if { var(txn.threadline_owner) -m str g0 }
--       use-server g1 if { var(txn.threadline_owner) -m str g1 }
--       server g0 10.0.0.10:8000 check
--       server g1 10.0.0.11:8000 check
--
-- A task polls each server of the backend named by the environment variable
-- THREADLINE_HAPROXY_BACKEND ("gateways" by default) for its `/livez`, which names the
-- partitions it owns, once a second (THREADLINE_HAPROXY_POLL_MS). A request whose path
-- names a thread (`/v1/threads/{id}...`, `/langgraph/threads/{id}...`) is given its
-- partition's owner; any other request, a partition whose owner is not known yet, or
-- an owner that is down, is balanced as the backend says, and the gateway that gets
-- it forwards it: the map is a shortcut, never needed for a right answer.

local backend_name = os.getenv("THREADLINE_HAPROXY_BACKEND") or "gateways"
local poll_ms = tonumber(os.getenv("THREADLINE_HAPROXY_POLL_MS") or "") or 1000

local owners = {}    -- partition -> server name, from the last poll
local partitions = 0 -- the topics' partition count, as the gateways report it

-- Kafka's murmur2 (the Java client's `Utils.murmur2`), on 32-bit words: the default
-- partitioner of a record's key, the thread id.
local function murmur2(data)
  local length = #data
  local m = 0x5bd1e995
  local h = (0x9747b28c ~ length) & 0xffffffff
  local length4 = length - length % 4
  for i = 1, length4, 4 do
    local b1, b2, b3, b4 = string.byte(data, i, i + 3)
    local k = b1 | (b2 << 8) | (b3 << 16) | (b4 << 24)
    k = (k * m) & 0xffffffff
    k = k ~ (k >> 24)
    k = (k * m) & 0xffffffff
    h = ((h * m) & 0xffffffff) ~ k
  end
  local rest = length % 4
  if rest == 3 then h = h ~ (string.byte(data, length4 + 3) << 16) end
  if rest >= 2 then h = h ~ (string.byte(data, length4 + 2) << 8) end
  if rest >= 1 then
    h = h ~ string.byte(data, length4 + 1)
    h = (h * m) & 0xffffffff
  end
  h = h ~ (h >> 13)
  h = (h * m) & 0xffffffff
  return h ~ (h >> 15)
end

local function partition_of(thread_id, count)
  return (murmur2(thread_id) & 0x7fffffff) % count
end

-- The thread a request path names, if any.
local function thread_of(path)
  local id = string.match(path, "^/v1/threads/([^/?]+)")
      or string.match(path, "^/langgraph/threads/([^/?]+)")
  if id == nil or id == "search" then
    return nil
  end
  -- The path is as sent, percent-encoded; the gateway hashes the id's UTF-8 bytes.
  return (string.gsub(id, "%%(%x%x)", function(hex) return string.char(tonumber(hex, 16)) end))
end

local function poll_once()
  local backend = core.backends[backend_name]
  if backend == nil then
    return
  end
  local found, count = {}, 0
  for name, server in pairs(backend.servers) do
    local client = core.httpclient()
    local ok, response = pcall(client.get, client,
                               {url = "http://" .. server:get_addr() .. "/livez", timeout = 1000})
    if ok and response ~= nil and response.status == 200 and response.body ~= nil then
      local total = tonumber(string.match(response.body, '"partitions"%s*:%s*(%d+)'))
      local owned = string.match(response.body, '"owned"%s*:%s*%[([%d,%s]*)%]')
      if total ~= nil and owned ~= nil then
        count = total
        for partition in string.gmatch(owned, "%d+") do
          found[tonumber(partition)] = name
        end
      end
    end
  end
  owners, partitions = found, count
end

core.register_task(function()
  while true do
    local ok, err = pcall(poll_once)
    if not ok then
      core.Warning("threadline: polling the gateways failed: " .. tostring(err))
    end
    core.msleep(poll_ms)
  end
end)

core.register_action("threadline_owner", {"http-req"}, function(txn)
  local id = thread_of(txn.sf:path())
  if id == nil or partitions == 0 then
    return
  end
  local owner = owners[partition_of(id, partitions)]
  if owner ~= nil then
    txn:set_var("txn.threadline_owner", owner)
  end
end)

-- GET <prefix>/<thread id>: the thread's partition, as this script computes it (for
-- checking it against the gateways' own: tests/cluster/test_owner_routing.py).
core.register_service("threadline_partition", "http", function(applet)
  local id = thread_of("/v1/threads/" .. (string.match(applet.path, "([^/]+)$") or "")) or ""
  local count = tonumber(applet.qs:match("partitions=(%d+)") or "") or partitions
  local body = tostring(count > 0 and partition_of(id, count) or -1)
  applet:set_status(200)
  applet:add_header("content-type", "text/plain")
  applet:add_header("content-length", tostring(#body))
  applet:start_response()
  applet:send(body)
end)
