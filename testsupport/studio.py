"""The studio's test data: a chat of ``n`` messages written into the studio's browser
storage (IndexedDB), as the studio itself stores chats. Used by the studio benchmark (2,000
messages) and the studio tests that need a long chat.

``SEED_CHAT`` is a JavaScript function for Playwright's ``page.evaluate(SEED_CHAT, n)``, run on
a page of the studio: it stores the chat ``bench-chat``, alternating questions and answers.
"""

SEED_CHAT = r"""async (n) => {
    const db = await new Promise((ok, no) => {
        const r = indexedDB.open("conch-studio", 1);
        r.onupgradeneeded = () => r.result.createObjectStore("chats", { keyPath: "id" });
        r.onsuccess = () => ok(r.result); r.onerror = () => no(r.error);
    });
    const now = Date.now(), messages = [];
    for (let i = 0; i < n; i++) {
        const user = i % 2 === 0;
        messages.push({ id: "m" + i, role: user ? "user" : "assistant", at: now - (n - i) * 1000,
            status: user ? undefined : "done",
            content: user ? "Question " + i + ": how do I sort a table by size?"
                : "Answer " + i + ": use `sort_by`.\n\n```\nls() | sort_by(\"size\")\n```\n\n"
                  + "- first point\n- second point with **bold** text\n" });
    }
    const chat = { id: "bench-chat", title: "2,000 messages", created: now, updated: now,
        settings: { model: "", system: "", temperature: 0.7, maxTokens: 256, topP: 1 }, messages };
    await new Promise((ok, no) => {
        const tx = db.transaction("chats", "readwrite"); tx.objectStore("chats").put(chat);
        tx.oncomplete = ok; tx.onerror = () => no(tx.error);
    });
}"""
