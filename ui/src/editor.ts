import { autocompletion, closeBrackets, closeBracketsKeymap, completionKeymap, type Completion, type CompletionContext } from "@codemirror/autocomplete";
import { defaultKeymap, history, historyKeymap, indentWithTab } from "@codemirror/commands";
import { bracketMatching, HighlightStyle, StreamLanguage, syntaxHighlighting, type StringStream } from "@codemirror/language";
import { EditorState, Prec, StateEffect, StateField } from "@codemirror/state";
import { type Diagnostic, linter } from "@codemirror/lint";
import { type Text } from "@codemirror/state";
import { Decoration, type DecorationSet, drawSelection, EditorView, highlightActiveLine, hoverTooltip, keymap, lineNumbers } from "@codemirror/view";
import { tags as t } from "@lezer/highlight";
import { ApiError, postJSON } from "./api";

// The keywords of SPEC §1.3; builtin names come from /api/v1/builtins at run time.
export const KEYWORDS = [
  "let", "mut", "fn", "if", "else", "match", "for", "in", "while", "break", "continue", "return",
  "try", "catch", "throw", "and", "or", "not",
];
const ATOMS = new Set(["true", "false", "null"]);
const KW = new Set(KEYWORDS);
let builtinNames = new Set<string>();

type St = { inTriple: boolean };

const conch = StreamLanguage.define<St>({
  name: "conch",
  startState: () => ({ inTriple: false }),
  token(stream: StringStream, state: St) {
    if (state.inTriple) {
      if (stream.skipTo('"""')) {
        stream.pos += 3;
        state.inTriple = false;
      } else stream.skipToEnd();
      return "string";
    }
    if (stream.eatSpace()) return null;
    if (stream.match("#")) {
      stream.skipToEnd();
      return "comment";
    }
    if (stream.match('"""')) {
      state.inTriple = true;
      return "string";
    }
    if (stream.match(/^"(?:[^"\\]|\\.)*"?/)) return "string";
    if (stream.match(/^'[^']*'?/)) return "string";
    if (stream.match(/^(?:0x[0-9a-fA-F_]+|0b[01_]+|\d[\d_]*(?:\.\d+)?(?:e[+-]?\d+)?(?:kib|kb|mib|mb|gib|gb|ms|min|s|h)?)/)) return "number";
    if (stream.match(/^[A-Za-z_][A-Za-z0-9_]*/)) {
      const w = stream.current();
      if (KW.has(w)) return "keyword";
      if (ATOMS.has(w)) return "atom";
      // "variableName.standard" (tags.standard(tags.variableName)): a name the language
      // provides. A bare "function" is a tag modifier, which CodeMirror rejects with a warning.
      if (builtinNames.has(w)) return "variableName.standard";
      return "variableName";
    }
    if (stream.match(/^(?:\|\||&&|==|!=|<=|>=|=~|=>|\.\.=|\.\.|\*\*|\/\/|\?\.|[|+\-*/%<>=!])/)) return "operator";
    stream.next();
    return null;
  },
  languageData: { commentTokens: { line: "#" } },
});

const style = HighlightStyle.define([
  { tag: t.keyword, color: "var(--hl-keyword)", fontWeight: "600" },
  { tag: t.string, color: "var(--hl-string)" },
  { tag: t.number, color: "var(--hl-number)" },
  { tag: t.atom, color: "var(--hl-number)" },
  { tag: t.comment, color: "var(--hl-comment)", fontStyle: "italic" },
  { tag: t.standard(t.variableName), color: "var(--hl-function)" },
  { tag: t.operator, color: "var(--hl-operator)" },
]);

let completions: Completion[] = KEYWORDS.map((k) => ({ label: k, type: "keyword" }));

export function setBuiltins(list: { name: string; description: string; category: string }[]): void {
  builtinNames = new Set(list.map((b) => b.name));
  completions = [
    ...list.map((b) => ({ label: b.name, type: "function", detail: b.category, info: b.description })),
    ...KEYWORDS.map((k) => ({ label: k, type: "keyword" })),
  ];
}

// -- the language server's front end, through the agent server (POST /api/v1/analyse) -------
// Diagnostics as you type, completions (bindings in scope, record fields, parameters) and
// hovers come from the same analysis as `conch lsp`; nothing is run. A server without the
// route (404) is asked no more, and the editor falls back to the builtin list.
type Analysed = {
  diagnostics: { kind: string; message: string; hint: string | null; severity: string; line: number; column: number; end_line: number; end_column: number }[];
  completions: { label: string; kind: string; detail: string; documentation: string; insert_text: string | null }[];
  hover: string | null;
};
let analyseAvailable = true;

async function analyse(code: string, at?: { line: number; column: number }): Promise<Analysed | null> {
  if (!analyseAvailable) return null;
  try {
    return await postJSON<Analysed>("/api/v1/analyse", { code, ...(at ?? {}) });
  } catch (e) {
    if (e instanceof ApiError && e.notAvailable) analyseAvailable = false;
    return null;
  }
}

/** A 1-based line and column counted in code points, as a document offset (UTF-16). */
function offsetOf(doc: Text, line: number, column: number): number {
  const ln = doc.line(Math.min(Math.max(1, line), doc.lines));
  let pos = ln.from;
  for (let i = 1; i < column && pos < ln.to; i++) pos += (ln.text.codePointAt(pos - ln.from) ?? 0) > 0xffff ? 2 : 1;
  return pos;
}

/** The cursor as the analysis counts it: 1-based line and code-point column. */
function cursorOf(doc: Text, pos: number): { line: number; column: number } {
  const ln = doc.lineAt(pos);
  return { line: ln.number, column: [...ln.text.slice(0, pos - ln.from)].length + 1 };
}

const conchLinter = linter(
  async (view) => {
    const doc = view.state.doc;
    const found = await analyse(doc.toString());
    if (!found) return [];
    return found.diagnostics.map((d): Diagnostic => {
      const from = offsetOf(doc, d.line, d.column);
      const to = Math.max(from, offsetOf(doc, d.end_line, d.end_column));
      return {
        from,
        to: to > from ? to : Math.min(doc.length, from + 1),
        severity: d.severity === "warning" ? "warning" : "error",
        source: d.kind,
        message: d.hint ? `${d.message} (${d.hint})` : d.message,
      };
    });
  },
  { delay: 300 },
);

const KINDS: Record<string, string> = { function: "function", variable: "variable", keyword: "keyword", field: "property", property: "property" };

async function complete(ctx: CompletionContext) {
  const word = ctx.matchBefore(/[A-Za-z_][A-Za-z0-9_]*/);
  const afterDot = ctx.matchBefore(/\.[A-Za-z0-9_]*/);
  if (!afterDot && (!word || (word.from === word.to && !ctx.explicit))) return null;
  const from = afterDot ? afterDot.from + 1 : word!.from;
  const found = await analyse(ctx.state.doc.toString(), cursorOf(ctx.state.doc, ctx.pos));
  if (!found || !found.completions.length) {
    return afterDot ? null : { from, options: completions, validFor: /^[A-Za-z0-9_]*$/ };
  }
  const options: Completion[] = found.completions.map((c) => ({
    label: c.label,
    type: KINDS[c.kind] ?? "variable",
    detail: c.detail || undefined,
    info: c.documentation || undefined,
    apply: c.insert_text ?? undefined,
  }));
  return { from, options, validFor: /^[A-Za-z0-9_]*$/ };
}

const conchHover = hoverTooltip(async (view, pos) => {
  const found = await analyse(view.state.doc.toString(), cursorOf(view.state.doc, pos));
  if (!found?.hover) return null;
  const text = found.hover;
  return {
    pos,
    create: () => {
      const dom = document.createElement("div");
      dom.className = "cm-conch-hover";
      dom.textContent = text;
      return { dom };
    },
  };
});

// -- the error mark: the offending token of the last run ------------------------------------
export const setErrorMark = StateEffect.define<{ line: number; column: number } | null>();
const errorField = StateField.define<DecorationSet>({
  create: () => Decoration.none,
  update(deco, tr) {
    deco = deco.map(tr.changes);
    for (const e of tr.effects) {
      if (!e.is(setErrorMark)) continue;
      if (!e.value) return Decoration.none;
      const doc = tr.state.doc;
      const ln = doc.line(Math.min(Math.max(1, e.value.line), doc.lines));
      const from = Math.min(ln.to, ln.from + Math.max(0, e.value.column - 1));
      const to = Math.min(ln.to, from + 1);
      const marks = [Decoration.line({ class: "cm-error-line" }).range(ln.from)];
      if (to > from) marks.push(Decoration.mark({ class: "cm-error-mark" }).range(from, to));
      return Decoration.set(marks);
    }
    if (tr.docChanged) return Decoration.none;
    return deco;
  },
  provide: (f) => EditorView.decorations.from(f),
});

export function createEditor(parent: HTMLElement, doc: string, onRun: () => void, onChange: (s: string) => void): EditorView {
  return new EditorView({
    parent,
    state: EditorState.create({
      doc,
      extensions: [
        lineNumbers(),
        history(),
        drawSelection(),
        highlightActiveLine(),
        bracketMatching(),
        closeBrackets(),
        conch,
        syntaxHighlighting(style),
        autocompletion({ override: [complete] }),
        conchLinter,
        conchHover,
        errorField,
        Prec.highest(keymap.of([{ key: "Mod-Enter", run: () => (onRun(), true) }])),
        // Tab indents; Escape then Tab moves focus on (CodeMirror), so the editor is no keyboard trap.
        keymap.of([...closeBracketsKeymap, ...defaultKeymap, ...historyKeymap, ...completionKeymap, indentWithTab]),
        EditorView.updateListener.of((u) => u.docChanged && onChange(u.state.doc.toString())),
        // tabindex: the content is what Tab reaches (as it would anyway, being editable), said
        // explicitly so a scrolled editor counts as keyboard-scrollable (axe: scrollable-region-focusable).
        EditorView.contentAttributes.of({ "aria-label": "conch program (Ctrl+Enter runs it)", tabindex: "0" }),
      ],
    }),
  });
}
