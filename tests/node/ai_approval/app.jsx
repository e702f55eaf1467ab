// A small chat on the AI SDK's React hook `useChat` (`@ai-sdk/react`), the way a team
// builds one, with tool approvals answered through the SDK's own API: a tool part in
// `approval-requested` shows its question and Approve / Deny, which call
// `addToolApprovalResponse`; `sendAutomaticallyWhen` sends the answer. Served from its
// own origin, it reads `config.json` from that origin (the gateway's URL and a
// short-lived browser token its backend minted), keeps the chat id in the URL, loads
// the stored messages and rejoins a run in progress on load (`resume: true`).
// Built by tests/browser/test_ai_sdk_approval_app.py with esbuild from tests/node's pinned packages.
import { useChat } from "@ai-sdk/react";
import { DefaultChatTransport, lastAssistantMessageIsCompleteWithApprovalResponses } from "ai";
import { useState } from "react";
import { createRoot } from "react-dom/client";

const config = await (await fetch("config.json")).json();
const api = `${config.apiUrl}/v1/ai/chat`;
const headers = { Authorization: `Bearer ${config.token}` };
const params = new URLSearchParams(window.location.search);
const chatId = params.get("chat") ?? `browser-${Date.now()}-${Math.random().toString(36).slice(2)}`;
window.history.replaceState(null, "", `?chat=${chatId}`);
const initial = (await (await fetch(`${api}/${encodeURIComponent(chatId)}/messages`, { headers })).json()).messages;

const transport = new DefaultChatTransport({
  api, headers,
  // The history is the server's: send the newest message only (a user message, or
  // the assistant message holding the answered approval).
  prepareSendMessagesRequest: ({ id, messages, trigger, messageId }) =>
    ({ body: { id, messages: messages.slice(-1), trigger, messageId } }),
});

// The text of the execution that answered: the newest of the attempt `finish` names.
function answerText(message) {
  const attempt = message.metadata?.attempt;
  const texts = message.parts.filter((p) => p.type === "text")
    .filter((p) => attempt == null || p.providerMetadata?.threadline?.attempt === attempt);
  const newest = texts.at(-1)?.providerMetadata?.threadline?.execution;
  return texts.filter((p) => newest == null || p.providerMetadata?.threadline?.execution === newest)
    .map((p) => p.text).join("");
}

function Tool({ part, answer }) {
  return (
    <div className="tool" data-tool={part.toolName} data-state={part.state} data-approval={part.approval?.id ?? ""}>
      <span className="name">{part.toolName}</span>
      {part.state === "approval-requested" && (
        <>
          <span className="question">{part.approval.descriptor?.question ?? "Allow?"}</span>
          <button type="button" onClick={() => answer({ id: part.approval.id, approved: true })}>Approve</button>
          <button type="button" onClick={() => answer({ id: part.approval.id, approved: false, reason: "not from the browser" })}>Deny</button>
        </>
      )}
      {part.state === "output-available" && <span className="output">{JSON.stringify(part.output?.content?.answer ?? part.output)}</span>}
    </div>
  );
}

function Chat() {
  const { messages, sendMessage, status, error, addToolApprovalResponse } = useChat({
    id: chatId, messages: initial, transport, resume: true,
    sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
  });
  const [input, setInput] = useState("");
  return (
    <main data-status={status} data-chat={chatId}>
      <ul id="messages">
        {messages.map((m) => (
          <li key={m.id} className={m.role}>
            {m.role === "assistant" ? (
              <>
                <p className="text">{answerText(m)}</p>
                {m.parts.filter((p) => p.type === "dynamic-tool").map((p) => (
                  <Tool key={p.toolCallId} part={p} answer={addToolApprovalResponse} />
                ))}
              </>
            ) : <p className="text">{m.parts.map((p) => (p.type === "text" ? p.text : "")).join("")}</p>}
          </li>
        ))}
      </ul>
      {error && <p role="alert">{String(error.message)}</p>}
      <form onSubmit={(e) => { e.preventDefault(); sendMessage({ text: input }); setInput(""); }}>
        <input name="message" value={input} onChange={(e) => setInput(e.target.value)} aria-label="Message" />
        <button type="submit" disabled={status !== "ready"}>Send</button>
      </form>
    </main>
  );
}

createRoot(document.getElementById("root")).render(<Chat />);
