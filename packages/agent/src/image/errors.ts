/** The agent image cannot be built: a Debian package or a file missing, a tool failing. Names the file, tool or package. */
export class AgentImageError extends Error {
  override name = 'AgentImageError';
}
