"""The JavaScript program a native Node.js context runs (kept as a string so it ships in the wheel).

Protocol: one JSON request per stdin line ``{"id", "code", "ts"}``; replies (``result``, ``error``,
``done``) as JSON lines on the fd named by ``SANDLOT_REPLY_FD``. User output goes to the real
stdout/stderr, and each run ends with a sentinel on both streams so the reader knows it has all
of the run's output before ``done``.
"""

RUNNER = r"""
(function () {
  'use strict';
  const fs = require('fs');
  const path = require('path');
  const util = require('util');
  const vm = require('vm');
  const Module = require('module');
  const SENT = '\u0000SANDLOT-END:';
  const REPLY = Number(process.env.SANDLOT_REPLY_FD);
  delete process.env.SANDLOT_REPLY_FD;
  const globalRoot = path.resolve(process.execPath, '..', '..', 'lib', 'node_modules');
  const userRequire = Module.createRequire(path.join(process.cwd(), '__sandlot__.js'));
  const lookup = [path.join(process.cwd(), 'node_modules'), globalRoot,
    '/usr/local/lib/node_modules', ...(process.env.NODE_PATH || '').split(':').filter(Boolean)];
  function req(name) {
    try { return userRequire(name); } catch (e) {
      if (e && e.code === 'MODULE_NOT_FOUND') {
        return userRequire(userRequire.resolve(name, { paths: lookup }));
      }
      throw e;
    }
  }
  globalThis.require = req;
  globalThis.module = { exports: {} };
  globalThis.exports = globalThis.module.exports;
  let ts = null;
  let count = 0;
  let pending = null;
  function reply(obj) { fs.writeSync(REPLY, JSON.stringify(obj) + '\n'); }
  function errorOf(id, err) {
    if (err && typeof err === 'object') {
      const stack = (typeof err.stack === 'string' ? err.stack.split('\n') : [])
        .filter((l) => !/\[eval\]|node:vm|node:internal|sigintHandlersWrap/.test(l));
      return { id, type: 'error', ename: String(err.name || 'Error'),
               evalue: String(err.message || ''), traceback: stack };
    }
    return { id, type: 'error', ename: 'Error', evalue: String(err), traceback: [] };
  }
  function finish(id) {
    if (pending && pending.id === id) pending = null;
    fs.writeSync(1, SENT + id + '\n');
    fs.writeSync(2, SENT + id + '\n');
    reply({ id, type: 'done', count });
  }
  function transpile(code) {
    if (!ts) ts = req('typescript');
    return ts.transpileModule(code, { compilerOptions: {
      target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.CommonJS, esModuleInterop: true,
    }, reportDiagnostics: false }).outputText;
  }
  function compile(src) {
    try {
      return new vm.Script(src, { filename: 'cell' + count + '.js' });
    } catch (e) {
      if (e instanceof SyntaxError && /await/.test(src)) {
        const wrapped = '(async () => {\n' + src + '\n})()';
        return new vm.Script(wrapped, { filename: 'cell' + count + '.js' });
      }
      throw e;
    }
  }
  function show(value) {
    const data = { 'text/plain': util.inspect(value, { depth: 4, colors: false }) };
    if (value !== null && typeof value === 'object' && !Array.isArray(value)) {
      try {
        data['application/json'] = JSON.parse(JSON.stringify(value));
      } catch (e) { /* not JSON-able */ }
    }
    return data;
  }
  async function run(msg) {
    count += 1;
    const id = msg.id;
    pending = { id };
    let done = false;
    const interrupted = new Promise((resolve) => { pending.interrupt = resolve; });
    try {
      let src = msg.code;
      if (msg.ts) src = transpile(src);
      const script = compile(src);
      let value = script.runInThisContext({ breakOnSigint: true, displayErrors: false });
      if (value && typeof value.then === 'function') {
        const out = await Promise.race([value.then((v) => ({ v })), interrupted]);
        if (out === 'interrupted') {
          const e = new Error('Script execution was interrupted'); e.name = 'KeyboardInterrupt';
          throw e;
        }
        value = out.v;
      }
      if (value !== undefined) reply({ id, type: 'result', data: show(value) });
    } catch (err) {
      reply(errorOf(id, err));
    } finally {
      done = true;
      finish(id);
    }
    return done;
  }
  process.on('SIGINT', () => {
    if (pending && pending.interrupt) pending.interrupt('interrupted');
  });
  process.on('uncaughtException', (err) => {
    process.stderr.write('Uncaught ' + (err && err.stack ? err.stack : String(err)) + '\n');
  });
  process.on('unhandledRejection', (err) => {
    const text = err && err.stack ? err.stack : String(err);
    process.stderr.write('Unhandled rejection: ' + text + '\n');
  });
  let queue = Promise.resolve();
  let buf = '';
  process.stdin.setEncoding('utf8');
  process.stdin.on('data', (chunk) => {
    buf += chunk;
    let nl;
    while ((nl = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, nl); buf = buf.slice(nl + 1);
      if (!line.trim()) continue;
      const msg = JSON.parse(line);
      queue = queue.then(() => run(msg));
    }
  });
  process.stdin.on('end', () => process.exit(0));
  reply({ type: 'ready' });
})();
"""
