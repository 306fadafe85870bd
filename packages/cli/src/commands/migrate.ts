import { openBMDB } from '../database.js';
import { type Argv, databaseSettings } from '../settings.js';

/** `shepherd migrate`: brings the BMDB schema up to date; a no-op when it is. */
export async function migrate(argv: Argv, write: (text: string) => void): Promise<void> {
  const bmdb = await openBMDB(databaseSettings(argv), { migrate: false, attach: true });
  try {
    const applied = await bmdb.migrate();
    write(applied.length ? `applied ${applied.join(', ')}\n` : 'schema up to date\n');
  } finally {
    await bmdb.close();
  }
}
