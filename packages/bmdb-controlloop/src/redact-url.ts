/**
 * `url` with its secret masked, for messages and logs: the password of its
 * user info (`postgres://bmdb:***@db:5432/bmdb`), or with `mask: 'userinfo'`
 * the user info whole (`https://***@bmc.example/`), where a user name alone
 * may be a token. Text that does not parse as a URL is masked all the same;
 * a URL with nothing to mask comes back as it was.
 */
export function redactUrl(url: string, mask: 'password' | 'userinfo' = 'password'): string {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    return mask === 'password'
      ? url.replace(/(\/\/[^:/@]*:)[^@/]*@/, '$1***@')
      : url.replace(/^([a-z][a-z0-9+.-]*:\/\/)[^/@]*@/i, '$1***@');
  }
  if (mask === 'password') {
    if (!parsed.password) return url;
    parsed.password = '***';
  } else {
    if (!parsed.username && !parsed.password) return url;
    parsed.username = '***';
    parsed.password = '';
  }
  return parsed.toString();
}
