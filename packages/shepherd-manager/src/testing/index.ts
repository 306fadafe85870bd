/**
 * Test support: an SSH client that answers as a machine whose agent took
 * over would, without a network, for this package's tests, the dummy
 * provider's pretend machines and the tests of packages built on it.
 *
 * @packageDocumentation
 */

export { type FakeExecution, FakeSshClient, type FakeSshHooks, type FakeUpload } from './fake-ssh-client.js';
