import { parseHash } from "../router";

const ALL = ["playground", "sessions", "chat", "models", "agents", "marketplace", "status"];

/** The 404 page: a route that names no page (or no object of a page). It says what was asked
 * for and links to what there is; it never falls back silently to another page. */
export function NotFound(props: { pages?: { id: string; title: string }[]; what?: string; back?: { href: string; label: string } }) {
  const route = parseHash();
  const asked = location.hash || "#/";
  const elsewhere = !props.what && ALL.includes(route.page);
  return (
    <section class="pane not-found" role="region" aria-labelledby="nf-title" data-testid="not-found">
      <h1 id="nf-title">{props.what ? `${props.what} not found` : "Page not found"}</h1>
      <p>
        Nothing here answers <code>{asked}</code>
        {elsewhere ? ": this server does not serve that page (the agent server, `conch up`, serves every page)." : "."}
      </p>
      {props.back && (
        <p>
          <a href={props.back.href}>{props.back.label}</a>
        </p>
      )}
      {props.pages && (
        <nav aria-label="Pages of this studio">
          <ul>
            {props.pages.map((p) => (
              <li key={p.id}>
                <a href={`#/${p.id}`}>{p.title}</a>
              </li>
            ))}
          </ul>
        </nav>
      )}
    </section>
  );
}
