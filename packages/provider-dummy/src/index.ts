/**
 * An in-process provider of pretend machines and a fake agent, for tests and
 * for the shepherd's zero-setup demo.
 *
 * @packageDocumentation
 */

export { type AgentStartEvent, DUMMY_PROVIDER, DummyProvider, type DummyProviderOptions } from './dummy-provider.js';
export { HeartbeatSimulator, type HeartbeatSimulatorOptions } from './heartbeat-simulator.js';
