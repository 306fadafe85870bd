import path from 'node:path';
import ts from 'typescript';

/**
 * What ARCHITECTURE.md's paths are checked against: the repository's sources
 * as the TypeScript compiler sees them, so that "this function calls that
 * one" is a fact about the code, not about a name appearing in a file.
 */
export class CallGraph {
  readonly #program: ts.Program;
  readonly #checker: ts.TypeChecker;

  /** A program over `files` (absolute paths) and what they import, resolved as the tests resolve it. */
  constructor(
    private readonly root: string,
    files: readonly string[],
  ) {
    const config = ts.readConfigFile(path.join(root, 'tsconfig.test.json'), ts.sys.readFile);
    const { options } = ts.parseJsonConfigFileContent(config.config, ts.sys, root);
    this.#program = ts.createProgram([...files], { ...options, noEmit: true });
    this.#checker = this.#program.getTypeChecker();
  }

  /**
   * The declaration of `name` in `file` (relative to the root): a function,
   * class, variable or interface (`runControlLoop`), or a member of a class
   * (`Runner.worker`, `Runner.#claim`). Undefined if there is none.
   */
  declaration(file: string, name: string): ts.Declaration | undefined {
    const source = this.#program.getSourceFile(path.join(this.root, file));
    if (!source) return undefined;
    const [outer, member] = name.split('.');
    const named = source.statements
      .flatMap(declarationsOf)
      .filter((declaration) => declaration.name?.getText(source) === outer);
    const found =
      member === undefined
        ? named
        : named.flatMap((declaration) =>
            ts.isClassDeclaration(declaration)
              ? declaration.members.filter((m) => m.name?.getText(source) === member)
              : [],
          );
    // Of an overloaded function, the implementation: the one that calls anything.
    return found.find((declaration) => 'body' in declaration && declaration.body !== undefined) ?? found[0];
  }

  /**
   * Whether `from` calls or hands over `to` (a call, or a reference such as
   * a callback): `to` is named inside `from`, or inside the initializer of a
   * field of its class that `from` uses (a batcher made with the method it
   * sends through, say). A chain of other functions in between does not
   * count: each step of a path is one such hand-over.
   */
  references(from: ts.Declaration, to: ts.Declaration): boolean {
    const target = this.#symbol(to);
    if (!target?.declarations) return false;
    const targets = new Set<ts.Node>(target.declarations);
    const fields = new Set<ts.Node>();
    const found = (node: ts.Node): boolean => {
      if (ts.isIdentifier(node) || ts.isPrivateIdentifier(node)) {
        const symbol = this.#resolved(this.#checker.getSymbolAtLocation(node));
        if (symbol?.declarations?.some((d) => targets.has(d))) return true;
        const field = symbol?.declarations?.find(
          (d): d is ts.PropertyDeclaration =>
            ts.isPropertyDeclaration(d) && d.initializer !== undefined && d.parent === from.parent,
        );
        if (field && !fields.has(field)) {
          fields.add(field);
          if (field.initializer && found(field.initializer)) return true;
        }
      }
      return ts.forEachChild(node, found) ?? false;
    };
    return ts.forEachChild(from, found) ?? false;
  }

  /** The names `file` (relative to the root) exports, through its re-exports. */
  exportsOf(file: string): string[] {
    const source = this.#program.getSourceFile(path.join(this.root, file));
    const module = source && this.#checker.getSymbolAtLocation(source);
    return module ? this.#checker.getExportsOfModule(module).map((symbol) => symbol.name) : [];
  }

  #symbol(declaration: ts.Declaration): ts.Symbol | undefined {
    const name = ts.getNameOfDeclaration(declaration);
    return this.#resolved(name ? this.#checker.getSymbolAtLocation(name) : undefined);
  }

  #resolved(symbol: ts.Symbol | undefined): ts.Symbol | undefined {
    return symbol && symbol.flags & ts.SymbolFlags.Alias ? this.#checker.getAliasedSymbol(symbol) : symbol;
  }
}

function declarationsOf(statement: ts.Statement): ts.NamedDeclaration[] {
  if (ts.isVariableStatement(statement)) return [...statement.declarationList.declarations];
  if (
    ts.isFunctionDeclaration(statement) ||
    ts.isClassDeclaration(statement) ||
    ts.isInterfaceDeclaration(statement) ||
    ts.isTypeAliasDeclaration(statement)
  ) {
    return [statement];
  }
  return [];
}
