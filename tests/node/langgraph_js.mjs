// The LangGraph JavaScript SDK (@langchain/langgraph-sdk, pinned in package.json)
// against a running Threadline gateway, through its public Client only: every method
// docs/clients.md lists for it. Driven by tests/frontends/test_langgraph_js.py, which
// asserts on what this prints: one "RESULT <json>" line, each method's outcome in it.
// The gateway's base URL and key come from THREADLINE_BASE_URL and THREADLINE_KEY.
import { Client } from "@langchain/langgraph-sdk";

const client = new Client({
  apiUrl: `${process.env.THREADLINE_BASE_URL}/langgraph`,
  apiKey: process.env.THREADLINE_KEY,
  defaultHeaders: {},
});
const rootClient = new Client({
  apiUrl: process.env.THREADLINE_BASE_URL, apiKey: process.env.THREADLINE_KEY,
});
const input = (text) => ({ messages: [{ type: "human", content: text }] });
const collect = async (stream) => { const parts = []; for await (const p of stream) parts.push(p); return parts; };
const failure = async (call) => {
  try { await call(); return null; } catch (e) { return { status: e.status ?? null, message: String(e.message ?? e) }; }
};
// What a screen shows from `messages-tuple` parts: each message id's text, chunks joined.
const screen = (parts) => {
  const shown = {};
  for (const p of parts) {
    if (p.event !== "messages") continue;
    const [chunk] = p.data;
    if (chunk.type === "AIMessageChunk" || chunk.type === "ai") shown[chunk.id] = (shown[chunk.id] ?? "") + chunk.content;
  }
  return shown;
};
const lastAi = (values) => values.messages.filter((m) => m.type === "ai").at(-1);
const events = (parts) => parts.map((p) => p.event);

const out = {};

// Threads.
const thread = await client.threads.create({ metadata: { from: "js" } });
const tid = thread.thread_id;
out.create = { thread_id: tid, status: thread.status };
out.get = { thread_id: (await client.threads.get(tid)).thread_id };
out.search = { found: (await client.threads.search({ limit: 100 })).some((t) => t.thread_id === tid) };

// runs.stream with two modes; state and history after it.
const streamed = await collect(client.runs.stream(tid, "agent", {
  input: input("hello from js"), streamMode: ["messages-tuple", "values"],
}));
const runId = streamed[0].data.run_id;
const state = await client.threads.getState(tid);
out.stream = { first: streamed[0].event, last: streamed.at(-1).event, events: [...new Set(events(streamed))],
               run_id: runId, screen: screen(streamed), stored: lastAi(state.values) };
out.getState = { messages: state.values.messages.length, next: state.next };
const history = await client.threads.getHistory(tid, { limit: 10 });
out.getHistory = { states: history.length, first_messages: history[0]?.values?.messages?.length ?? null };

// runs.get, list, join, wait.
out.get_run = { status: (await client.runs.get(tid, runId)).status };
const created = await client.runs.create(tid, "agent", { input: input("second one") });
const joined = await client.runs.join(tid, created.run_id);
out.join = { messages: joined.messages.length, status: (await client.runs.get(tid, created.run_id)).status };
const waited = await client.runs.wait(tid, "agent", { input: input("third one") });
out.wait = { messages: waited.messages.length };
out.list = { runs: (await client.runs.list(tid)).map((r) => r.run_id) };

// joinStream of the finished first run: a string mode, an array of modes, after a
// mid-stream id, and from "-1" (useStream's "no id yet": the run's start).
const single = await collect(client.runs.joinStream(tid, runId, { streamMode: "values" }));
out.joinStream_string = { events: [...new Set(events(single))] };
const both = await collect(client.runs.joinStream(tid, runId, { streamMode: ["messages-tuple", "values"] }));
out.joinStream_array = { events: [...new Set(events(both))], screen: screen(both), parts: both.length };
const fromStart = await collect(client.runs.joinStream(tid, runId, {
  streamMode: ["messages-tuple", "values"], lastEventId: "-1",
}));
out.joinStream_minus_one = { same: JSON.stringify(fromStart) === JSON.stringify(both), parts: fromStart.length };
const middle = Math.floor(both.length / 2);
const rest = await collect(client.runs.joinStream(tid, runId, {
  streamMode: ["messages-tuple", "values"], lastEventId: both[middle].id,
}));
out.joinStream_mid = { id: both[middle].id ?? null,
                       same: JSON.stringify(rest) === JSON.stringify(both.slice(middle + 1)) };

// A live run: joinStream while it streams; then cancel one.
const live = await client.runs.create(tid, "agent", { input: input("a live one") });
const liveParts = await collect(client.runs.joinStream(tid, live.run_id, { streamMode: ["messages-tuple"] }));
out.joinStream_live = { events: [...new Set(events(liveParts))], text: Object.values(screen(liveParts)).join("") };
const slow = await client.runs.create(tid, "agent", { input: input("take your time [slow]") });
await client.runs.cancel(tid, slow.run_id, true);
out.cancel = { status: (await client.runs.get(tid, slow.run_id)).status };

// Assistants.
const assistants = await client.assistants.search({ limit: 10 });
out.assistants = { ids: assistants.map((a) => a.assistant_id),
                   get: (await client.assistants.get(assistants[0].assistant_id)).assistant_id };

// Multitask: reject while a run is active (409), enqueue runs after it.
const busy = await client.runs.create(tid, "agent", { input: input("busy now [slow]") });
out.reject = await failure(() => client.runs.create(tid, "agent", {
  input: input("not now"), multitaskStrategy: "reject" }));
const queued = await client.runs.create(tid, "agent", { input: input("after that"), multitaskStrategy: "enqueue" });
await client.runs.cancel(tid, busy.run_id, false);
const afterQueue = await client.runs.join(tid, queued.run_id);
out.enqueue = { status: (await client.runs.get(tid, queued.run_id)).status, messages: afterQueue.messages.length };

// An interrupt, then `command: {resume}`.
const hitl = (await client.threads.create()).thread_id;
const asked = await collect(client.runs.stream(hitl, "agent", {
  input: input("deploy it [approve]"), streamMode: ["updates"] }));
const interrupts = asked.filter((p) => p.event === "updates" && p.data.__interrupt__).flatMap((p) => p.data.__interrupt__);
const resumed = await collect(client.runs.stream(hitl, "agent", {
  command: { resume: "ship-js" }, streamMode: ["values"] }));
out.interrupt = { asked: interrupts.map((i) => i.value), thread_status: null,
                  answer: lastAi(resumed.filter((p) => p.event === "values").at(-1).data).content };
out.interrupt.thread_status = (await client.threads.get(hitl)).status;

// A client pointed at the bare root is told where the API lives.
out.bare_root = await failure(() => rootClient.threads.create());

console.log(`RESULT ${JSON.stringify(out)}`);
