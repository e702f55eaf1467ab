// The official AI SDK (`ai`, pinned in package.json) against a running Threadline
// gateway: its Chat logic (AbstractChat) over its own DefaultChatTransport, whose
// stream parser validates every chunk against the SDK's strict schema.
//
// Driven by tests/frontends/test_ai_sdk.py. Scenario from argv[2]; the gateway's
// base URL and key from THREADLINE_BASE_URL and THREADLINE_KEY. It prints
// "MARK <name> <json>" lines and, where the driver must act (kill the gateway),
// waits for "GO <name>" on stdin. The last line is "RESULT <json>".
import { AbstractChat, DefaultChatTransport, lastAssistantMessageIsCompleteWithApprovalResponses } from "ai";
import { createInterface } from "node:readline";

const base = process.env.THREADLINE_BASE_URL;
const auth = { Authorization: `Bearer ${process.env.THREADLINE_KEY}` };
const api = `${base}/v1/ai/chat`;

const lines = createInterface({ input: process.stdin });
const waiting = new Map();
const released = new Set();  // GO lines that came before the script waited for them
lines.on("line", (line) => {
  const [word, name] = line.trim().split(" ");
  if (word !== "GO") return;
  if (waiting.has(name)) { waiting.get(name)(); waiting.delete(name); } else released.add(name);
});
const go = (name) => new Promise((resolve) => {
  if (released.delete(name)) resolve(); else waiting.set(name, resolve);
});
const mark = (name, data = {}) => console.log(`MARK ${name} ${JSON.stringify(data)}`);

class State {
  constructor() { this.messages = []; this.status = "ready"; this.error = undefined; }
  pushMessage(m) { this.messages = this.messages.concat(m); }
  popMessage() { this.messages = this.messages.slice(0, -1); }
  replaceMessage(i, m) { this.messages = [...this.messages.slice(0, i), m, ...this.messages.slice(i + 1)]; }
  snapshot(thing) { return structuredClone(thing); }
}

class Chat extends AbstractChat {
  constructor(init) {
    const state = new State();
    super({ ...init, state });
    this.errors = [];
    this.data = [];
  }
}

function newChat(id) {
  const chat = new Chat({
    id,
    transport: new DefaultChatTransport({ api, headers: auth }),
    onError: (error) => chat.errors.push(String(error && error.message)),
    onData: (part) => chat.data.push(structuredClone(part)), // the SDK later updates a part in place
  });
  return chat;
}

// A chat that answers tool approvals the SDK's way: addToolApprovalResponse, then
// sendAutomaticallyWhen sends the answer. Its transport's fetch keeps each request's
// body and a copy of each response's text.
function approvalChat(id) {
  const posts = [];
  const chat = new Chat({
    id,
    transport: new DefaultChatTransport({
      api, headers: auth,
      fetch: async (url, init) => {
        const response = await fetch(url, init);
        posts.push({ body: init.body, status: response.status, text: response.clone().text() });
        return response;
      },
    }),
    sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
    onError: (error) => chat.errors.push(String(error && error.message)),
    onData: (part) => chat.data.push(structuredClone(part)),
    onFinish: ({ finishReason }) => chat.finishes.push(finishReason ?? null),
  });
  chat.posts = posts;
  chat.finishes = [];
  return chat;
}

const toolPart = (message, name) => message && message.parts.find((p) => p.type === "dynamic-tool" && p.toolName === name);
// The call of `name` by the attempt that answered (`finish` names it): call ids are
// `<message>:<attempt>:tool:<k>`, and an attempt retried after the approval (its
// heartbeats missed on a loaded machine) calls it again under its own id.
const answeringToolPart = (message, name) => {
  const attempt = message && message.metadata && message.metadata.attempt;
  const prefix = message && `${message.id}:${attempt}:tool:`;
  return (message && message.parts.find((p) => p.type === "dynamic-tool" && p.toolName === name
                                         && p.toolCallId.startsWith(prefix))) || toolPart(message, name);
};

// Human in the loop through the SDK's tool approval: [confirm] makes the agent's
// `confirm` tool interrupt. The first response ends at the approval request; the
// client answers with addToolApprovalResponse and the SDK posts the answer itself
// (sendAutomaticallyWhen); that response is the rest of the run, into the same
// message. Then the identical answer is posted again by hand.
async function approval(approved, reason) {
  const chat = approvalChat(`node-approval-${approved}-${Date.now()}`);
  await chat.sendMessage({ text: "[tools=1] deploy it [confirm]" });
  const asked = structuredClone(toolPart(lastAssistant(chat), "confirm"));
  const statusAsked = chat.status;
  await chat.addToolApprovalResponse({ id: asked.approval.id, approved, reason });
  await until(() => chat.finishes.length === 2 && chat.status !== "submitted" && chat.status !== "streaming",
              "the answer's response");
  const message = lastAssistant(chat);
  const answerPost = chat.posts[1];
  const again = await fetch(api, { method: "POST", headers: { ...auth, "Content-Type": "application/json" },
                                   body: answerPost.body });
  return { chatId: chat.id, asked, statusAsked, finishes: chat.finishes, status: chat.status,
           part: answeringToolPart(message, "confirm"), text: answerText(message), id: message.id,
           messageIds: chat.messages.map((m) => m.role), metadata: message.metadata, errors: chat.errors,
           posts: await Promise.all(chat.posts.map(async (p) => ({ body: JSON.parse(p.body), status: p.status, text: await p.text }))),
           again: { status: again.status, text: await again.text() },
           stored: await stored(chat.id) };
}

const lastAssistant = (chat) => [...chat.messages].reverse().find((m) => m.role === "assistant");

// As after a reload: the partial answer is not a stored message, so drop it and let
// the replay rebuild it whole.
async function resumeAsAfterReload(chat) {
  if (chat.lastMessage && chat.lastMessage.role === "assistant") chat.messages = chat.messages.slice(0, -1);
  await chat.resumeStream();
}

// What a kill scenario reports: the chat's state after it, and the stored messages.
async function killOutcome(chat, statusAfterKill, seenBefore) {
  const message = lastAssistant(chat);
  return { chatId: chat.id, statusAfterKill, seenBefore, status: chat.status, text: answerText(message),
           id: message && message.id, metadata: message && message.metadata, errors: chat.errors,
           stored: await stored(chat.id) };
}
// The text of the attempt that answered: a superseded attempt's text parts stay in
// the message, tagged with their attempt (docs/clients.md).
// The answer: the text of the attempt `finish` names, and of that attempt's newest
// execution (a worker restarted in place runs the same attempt again).
function answerText(message) {
  if (!message) return null;
  const attempt = message.metadata && message.metadata.attempt;
  const texts = message.parts
    .filter((p) => p.type === "text")
    .filter((p) => attempt == null || !p.providerMetadata || p.providerMetadata.threadline.attempt === attempt);
  const tagged = texts.filter((p) => p.providerMetadata);
  const newest = tagged.length ? tagged[tagged.length - 1].providerMetadata.threadline.execution : null;
  return texts.filter((p) => newest == null || !p.providerMetadata || p.providerMetadata.threadline.execution === newest)
    .map((p) => p.text).join("");
}

async function stored(chatId) {
  const response = await fetch(`${api}/${encodeURIComponent(chatId)}/messages`, { headers: auth });
  return (await response.json()).messages;
}

async function until(check, what, timeoutMs = 60_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

const streamingText = (chat) => {
  const m = lastAssistant(chat);
  return m && m.parts.some((p) => p.type === "text" && p.text.length > 0);
};

const scenarios = {
  // Two answers streamed through the SDK, each equal to the stored message.
  async stream() {
    const chat = newChat(`node-stream-${Date.now()}`);
    const results = [];
    for (const text of ["hello from the AI SDK", "and a second question"]) {
      await chat.sendMessage({ text });
      const message = lastAssistant(chat);
      results.push({ status: chat.status, text: answerText(message), id: message && message.id,
                     parts: message ? message.parts.map((p) => p.type) : [], metadata: message && message.metadata });
    }
    return { chatId: chat.id, results, errors: chat.errors, data: chat.data.map((d) => d.data.event),
             stored: await stored(chat.id) };
  },

  // The app's stop: the cancel endpoint, then the SDK's stop().
  async stop() {
    const chat = newChat(`node-stop-${Date.now()}`);
    const sending = chat.sendMessage({ text: "[slow] stop me" });
    await until(() => streamingText(chat), "the first text");
    const cancel = await fetch(`${api}/${encodeURIComponent(chat.id)}/cancel`, { method: "POST", headers: auth });
    await chat.stop();
    await sending;
    const after = await fetch(`${api}/${encodeURIComponent(chat.id)}/stream`, { headers: auth });
    return { chatId: chat.id, cancelStatus: cancel.status, cancel: await cancel.json(), status: chat.status,
             resumeStatus: after.status, metadata: lastAssistant(chat).metadata, errors: chat.errors,
             stored: await stored(chat.id) };
  },

  // A reload resumes: the gateway is killed mid-answer, the fetch fails, and
  // resumeStream() (GET .../{id}/stream) replays the active run from its start.
  async resume() {
    const chat = newChat(`node-resume-${Date.now()}`);
    const sending = chat.sendMessage({ text: "[slow] survive a gateway kill" });
    await until(() => streamingText(chat), "the first text");
    const seenBefore = answerText(lastAssistant(chat));
    mark("streaming", { chars: seenBefore.length });
    await go("killed");
    await sending;
    const statusAfterKill = chat.status;
    await go("restarted");
    await resumeAsAfterReload(chat);
    return killOutcome(chat, statusAfterKill, seenBefore);
  },

  // Behind a load balancer (tests/cluster): a gateway is killed mid-answer; if the chat's
  // fetch went through it, the fetch fails and resumeStream() replays the run as after
  // a reload; if it went through another, that gateway goes on with the answer from the
  // partition's new owner and the fetch ends normally.
  async resumeBehindBalancer() {
    const chat = newChat(`node-balanced-${Date.now()}`);
    const sending = chat.sendMessage({ text: "[slow] survive a gateway kill" });
    await until(() => streamingText(chat), "the first text");
    const seenBefore = answerText(lastAssistant(chat));
    mark("streaming", { chars: seenBefore.length, chatId: chat.id });
    await go("killed");
    await sending;
    const statusAfterKill = chat.status;
    await go("restarted");
    if (statusAfterKill === "error") await resumeAsAfterReload(chat);
    return killOutcome(chat, statusAfterKill, seenBefore);
  },

  // The worker killed mid-answer: a new execution starts over (the same attempt when the
  // worker is back before the heartbeat timeout, the next one after it). The SDK cannot
  // take text back, so the superseded execution's text part stays, tagged with its
  // attempt and execution; the answer is the newest execution's text of the attempt
  // `finish` names.
  async worker() {
    const chat = newChat(`node-worker-${Date.now()}`);
    const sending = chat.sendMessage({ text: "[slow] survive a worker kill" });
    await until(() => streamingText(chat), "the first text");
    mark("streaming");
    await sending;
    const message = lastAssistant(chat);
    return { chatId: chat.id, status: chat.status, text: answerText(message), id: message.id,
             metadata: message.metadata, errors: chat.errors, parts: message.parts.map((p) => p.type),
             attempts: message.parts.filter((p) => p.type === "text").map((p) => p.providerMetadata.threadline.attempt),
             executions: message.parts.filter((p) => p.type === "text").map((p) => p.providerMetadata.threadline.execution),
             stored: await stored(chat.id) };
  },

  // Human in the loop: the run asks ([approve]) after a journaled turn; the client
  // answers over the native resume endpoint, and the same stream goes on to the
  // answer. The resumed execution replays the turn: the newest execution's text is
  // the answer (docs/clients.md).
  async interrupt() {
    const chat = newChat(`node-interrupt-${Date.now()}`);
    const sending = chat.sendMessage({ text: "[tools=1] deploy it [approve]" });
    const asked = await until(() => chat.data.find((d) => d.data.event === "interrupt"), "the interrupt");
    const statusWhileWaiting = chat.status;
    const threadId = lastAssistant(chat).metadata.thread_id;
    const resume = await fetch(`${base}/v1/threads/${threadId}/runs/${asked.data.run_id}/resume`, {
      method: "POST", headers: { ...auth, "Content-Type": "application/json" },
      body: JSON.stringify({ value: "yes" }) });
    await sending;
    const message = lastAssistant(chat);
    const texts = message.parts.filter((p) => p.type === "text");
    const executions = texts.map((p) => p.providerMetadata.threadline.execution);
    const newest = executions[executions.length - 1];
    return { chatId: chat.id, question: JSON.parse(asked.data.detail), statusWhileWaiting,
             resumeStatus: resume.status, status: chat.status, executions,
             text: texts.filter((p) => p.providerMetadata.threadline.execution === newest).map((p) => p.text).join(""),
             allText: texts.map((p) => p.text).join(""), metadata: message.metadata, errors: chat.errors,
             stored: await stored(chat.id) };
  },

  // Branches (issue #30): regenerate() twice (the last answer, then one named by its
  // id), then an edit of the first message (sendMessage with its messageId). After
  // each, the chat's messages and the stored current branch.
  async branches() {
    const chat = newChat(`node-branches-${Date.now()}`);
    const shot = () => ({ status: chat.status, ids: chat.messages.map((m) => m.id),
                          roles: chat.messages.map((m) => m.role),
                          text: answerText(lastAssistant(chat)) });
    const steps = [];
    await chat.sendMessage({ text: "what is a branch" });
    steps.push(shot());
    await chat.regenerate();
    steps.push(shot());
    await chat.regenerate({ messageId: lastAssistant(chat).id });
    steps.push(shot());
    const firstUser = chat.messages[0].id;
    await chat.sendMessage({ text: "what is a tree", messageId: firstUser });
    steps.push({ ...shot(), userText: chat.messages[0].parts.find((p) => p.type === "text").text });
    return { chatId: chat.id, steps, errors: chat.errors,
             threadId: lastAssistant(chat).metadata.thread_id, stored: await stored(chat.id) };
  },
};

scenarios.approve = () => approval(true, undefined);
scenarios.deny = () => approval(false, "not today");

try {
  const result = await scenarios[process.argv[2]]();
  console.log(`RESULT ${JSON.stringify(result)}`);
  process.exit(0);
} catch (error) {
  console.log(`RESULT ${JSON.stringify({ failure: String(error && error.stack) })}`);
  process.exit(1);
}
