import { type Html, html } from '../html.js';

/** The login form: the token is entered once, then the login cookie carries it. */
export function loginPage(next: string, failed: boolean): Html {
  return html`<h1>Log in</h1>
${failed ? html`<p class="notice error">That is not the token.</p>` : ''}
<form class="filters" method="post" action="/login">
<input type="hidden" name="next" value="${next}">
<label>web token<input type="password" name="token" autocomplete="current-password" required autofocus></label>
<button type="submit">Log in</button>
</form>
<p class="muted">The token is the shepherd's <code>--web-token</code> (<code>SHEPHERD_WEB_TOKEN</code>). Scripts send it as <code>Authorization: Bearer …</code>.</p>`;
}
