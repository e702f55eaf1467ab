"""Testing kit: role processes, a broker and stack for a test, an SSE client and history replay."""
