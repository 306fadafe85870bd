import createDebug from 'debug';

/** SSH events worth a line by default: uploads, commands' exits, failures. */
export const log = createDebug('shepherd:ssh');
/** Each connection's steps (dialing, connected, closed); the CLI's default logs leave them out. */
export const detail = createDebug('shepherd:ssh:detail');
