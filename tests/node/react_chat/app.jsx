// A small chat on the LangGraph SDK's React hook `useStream`, the way a team builds one:
// served from its own origin, it reads `config.json` from that origin (the gateway's
// LangGraph URL and a short-lived browser token its backend minted), keeps the thread id
// in the URL and rejoins a run in progress after a reload (`reconnectOnMount`).
// Built by tests/browser/test_react_chat.py with esbuild from tests/node's pinned packages.
import { useStream } from "@langchain/langgraph-sdk/react";
import { useEffect, useState } from "react";
import { createRoot } from "react-dom/client";

const config = await (await fetch("config.json")).json();

// What the screen showed, render by render, for the test: each AI message's text and
// whether a stream was running.
window.screens = [];

function text(message) {
  if (typeof message.content === "string") return message.content;
  return (message.content ?? []).map((part) => part.text ?? "").join("");
}

function Chat() {
  const [threadId, setThreadId] = useState(
    () => new URLSearchParams(window.location.search).get("thread"));
  const [error, setError] = useState(null);
  const stream = useStream({
    apiUrl: config.apiUrl,
    apiKey: config.token,
    assistantId: "agent",
    threadId,
    onThreadId: (id) => {
      setThreadId(id);
      window.history.replaceState(null, "", `?thread=${id}`);
    },
    reconnectOnMount: true,
    onFinish: () => {},  // a finished run refetches the thread: the screen is what was stored
    onError: (e) => setError(String(e?.message ?? e)),
  });
  const messages = stream.messages;
  const interrupt = stream.interrupt;
  useEffect(() => {
    window.screens.push({
      loading: stream.isLoading,
      ai: messages.filter((m) => m.type === "ai").map(text),
    });
  });
  const send = (event) => {
    event.preventDefault();
    const input = event.target.elements.message;
    const message = { type: "human", content: input.value };
    input.value = "";
    setError(null);
    // A second message while a run is active waits for it on the server ("enqueue").
    stream.submit({ messages: [message] }, { multitaskStrategy: "enqueue" });
  };
  const answer = (value) => stream.submit(undefined, { command: { resume: value } });
  return (
    <main data-thread={threadId ?? ""} data-loading={String(stream.isLoading)}>
      <ol id="messages">
        {messages.map((m, i) => (
          <li key={m.id ?? i} className={m.type} data-id={m.id ?? ""}>{text(m)}</li>
        ))}
      </ol>
      {interrupt?.value != null && !stream.isLoading && (
        <section id="approval" role="dialog" aria-label="Approval needed">
          <p id="question">{interrupt.value.question ?? JSON.stringify(interrupt.value)}</p>
          <button id="approve" onClick={() => answer("approved")}>Approve</button>
          <button id="reject" onClick={() => answer("rejected")}>Reject</button>
        </section>
      )}
      {error && <p id="error" role="alert">{error}</p>}
      <form onSubmit={send}>
        <input name="message" aria-label="Message" autoComplete="off" />
        <button type="submit">Send</button>
      </form>
    </main>
  );
}

createRoot(document.getElementById("root")).render(<Chat />);
