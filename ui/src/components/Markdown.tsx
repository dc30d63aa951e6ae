import { marked, type Token, type Tokens } from "marked";
import { CopyButton } from "./CopyButton";

// marked only tokenises here; the tokens become Preact nodes, so model text is always
// rendered as text (an HTML token is shown as its source, never parsed).

function inline(tokens: Token[] | undefined): any {
  return (tokens ?? []).map((t, i) => {
    switch (t.type) {
      case "strong":
        return <strong key={i}>{inline((t as Tokens.Strong).tokens)}</strong>;
      case "em":
        return <em key={i}>{inline((t as Tokens.Em).tokens)}</em>;
      case "codespan":
        return <code key={i}>{((t as Tokens.Codespan).text)}</code>;
      case "del":
        return <del key={i}>{inline((t as Tokens.Del).tokens)}</del>;
      case "br":
        return <br key={i} />;
      case "link": {
        const l = t as Tokens.Link;
        const safe = /^(https?:|mailto:)/i.test(l.href);
        return safe ? (
          <a key={i} href={l.href} target="_blank" rel="noopener noreferrer nofollow">
            {inline(l.tokens)}
          </a>
        ) : (
          <span key={i}>{inline(l.tokens)}</span>
        );
      }
      case "text":
        return (t as Tokens.Text).tokens ? inline((t as Tokens.Text).tokens) : ((t as Tokens.Text).text);
      case "escape":
        return ((t as Tokens.Escape).text);
      default:
        return t.raw;
    }
  });
}

function block(tokens: Token[]): any {
  return tokens.map((t, i) => {
    switch (t.type) {
      case "paragraph":
        return <p key={i}>{inline((t as Tokens.Paragraph).tokens)}</p>;
      case "heading": {
        const h = t as Tokens.Heading;
        const Tag = `h${Math.min(6, h.depth + 2)}` as "h3";
        return <Tag key={i}>{inline(h.tokens)}</Tag>;
      }
      case "code": {
        const c = t as Tokens.Code;
        return (
          <div key={i} class="code-block">
            <CopyButton text={() => c.text} label={`Copy code${c.lang ? ` (${c.lang})` : ""}`} class="copy-code" />
            <pre class="code" data-lang={c.lang || undefined}>
              <code>{c.text}</code>
            </pre>
          </div>
        );
      }
      case "blockquote":
        return <blockquote key={i}>{block((t as Tokens.Blockquote).tokens)}</blockquote>;
      case "list": {
        const l = t as Tokens.List;
        const items = l.items.map((it, j) => <li key={j}>{block(it.tokens)}</li>);
        return l.ordered ? <ol key={i}>{items}</ol> : <ul key={i}>{items}</ul>;
      }
      case "hr":
        return <hr key={i} />;
      case "space":
        return null;
      case "text": {
        const tt = t as Tokens.Text;
        return <span key={i}>{tt.tokens ? inline(tt.tokens) : (tt.text)}</span>;
      }
      case "table": {
        const tb = t as Tokens.Table;
        return (
          // A table wider than the message scrolls in its own box (focusable, for the keyboard).
          <div key={i} class="scroll-x" tabIndex={0} role="region" aria-label="Table">
            <table class="md-table">
              <thead>
                <tr>{tb.header.map((h, j) => <th key={j}>{inline(h.tokens)}</th>)}</tr>
              </thead>
              <tbody>
                {tb.rows.map((r, j) => (
                  <tr key={j}>{r.map((c, k) => <td key={k}>{inline(c.tokens)}</td>)}</tr>
                ))}
              </tbody>
            </table>
          </div>
        );
      }
      default:
        return <p key={i}>{t.raw}</p>;
    }
  });
}

export function Markdown({ text }: { text: string }) {
  return <div class="md">{block(marked.lexer(text, { gfm: true }))}</div>;
}
