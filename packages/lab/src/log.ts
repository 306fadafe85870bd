import createDebug from 'debug';

/** The lab's log lines, `DEBUG=shepherd:lab*`. */
export const log = createDebug('shepherd:lab');
