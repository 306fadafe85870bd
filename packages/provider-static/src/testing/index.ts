/**
 * Test support: a fake Redfish BMC over real HTTP or HTTPS on 127.0.0.1,
 * and throwaway self-signed certificates for it, for this package's tests
 * and for tests of packages built on it. The certificates are written by
 * `@bmaas/common`'s X.509 writer, so no `openssl` command is needed.
 *
 * @packageDocumentation
 */

export { selfSignedCertificate, type TestCertificate } from './certificate.js';
export {
  FAKE_BOOT_SOURCES,
  type FakeBootSource,
  type FakePowerBackend,
  FakePowerRefusal,
  type FakePowerState,
  SimulatedPower,
} from './fake-power.js';
export {
  type FakeBootOverride,
  type FakeRedfishFault,
  type FakeRedfishRequest,
  FakeRedfishServer,
  type FakeRedfishServerOptions,
  type FakeReset,
  type FakeSystemOptions,
  type FakeVirtualMedia,
} from './fake-redfish.js';
export { IPMI_SIM, IpmiSimulator, type IpmiSimulatorOptions, onPath } from './ipmi-sim.js';
