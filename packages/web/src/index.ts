/**
 * The read-only fleet page over the BMDB: the fleet at a glance, a
 * filterable table of machines and each machine's story, as server-rendered
 * HTML (no JavaScript needed) and the same data as JSON under `/api/`.
 *
 * @packageDocumentation
 */

export { checkTlsRule, checkTokenRule, isLoopback, WebTlsError, WebTokenError } from './access.js';
export type { MachineList, MachineView, Overview } from './data.js';
export {
  attachFleetPage,
  type FleetPageOptions,
  type FleetPageServer,
  type FleetPageTls,
  fleetPageHandler,
  type ServeOptions,
  serveFleetPage,
  WebListenError,
} from './server.js';
