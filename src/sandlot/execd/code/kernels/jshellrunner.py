"""The Java program behind a Java context: the JDK's JShell API on a line protocol (see pipe.py).

Kept as a string so it ships in the wheel; :mod:`.java` compiles it once per execd with ``javac``.
Requests are ``<run id> <base64 code>`` lines; a cell is split into snippets with JShell's own
``analyzeCompletion``, each evaluated in turn; a rejected snippet becomes a ``CompilationError``,
an exception in user code its class name; the value of a cell's last expression is its result.
SIGINT stops the running snippet (``JShell.stop``), like a Jupyter interrupt.
"""

CLASS_NAME = "SandlotJShell"

SOURCE = r"""
import java.io.*;
import java.nio.charset.StandardCharsets;
import java.util.*;
import jdk.jshell.*;

public class SandlotJShell {
    static final String SENT = "\u0000SANDLOT-END:";
    static final String IMPORTS = "import java.io.*; import java.math.*; import java.net.*; "
        + "import java.nio.file.*; import java.util.*; import java.util.concurrent.*; "
        + "import java.util.function.*; import java.util.regex.*; import java.util.stream.*;";
    static PrintStream reply;
    static PrintStream out;
    static PrintStream err;
    static JShell shell;
    static volatile boolean running;
    static volatile boolean stopped;

    static String q(String s) {
        if (s == null) return "null";
        StringBuilder b = new StringBuilder("\"");
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"': b.append("\\\""); break;
                case '\\': b.append("\\\\"); break;
                case '\n': b.append("\\n"); break;
                case '\r': b.append("\\r"); break;
                case '\t': b.append("\\t"); break;
                default:
                    if (c < 0x20) b.append(String.format("\\u%04x", (int) c)); else b.append(c);
            }
        }
        return b.append('"').toString();
    }

    static String list(List<String> items) {
        StringBuilder b = new StringBuilder("[");
        for (int i = 0; i < items.size(); i++) {
            if (i > 0) b.append(',');
            b.append(q(items.get(i)));
        }
        return b.append(']').toString();
    }

    static synchronized void send(String json) { reply.println(json); reply.flush(); }

    static void error(String id, String ename, String evalue, List<String> tb) {
        send("{\"id\":" + q(id) + ",\"type\":\"error\",\"ename\":" + q(ename) + ",\"evalue\":"
             + q(evalue) + ",\"traceback\":" + list(tb) + "}");
    }

    static boolean shows(Snippet sn) {
        if (sn.kind() == Snippet.Kind.EXPRESSION) return true;
        return sn.kind() == Snippet.Kind.VAR
            && sn.subKind() == Snippet.SubKind.TEMP_VAR_EXPRESSION_SUBKIND;
    }

    static boolean report(String id, SnippetEvent ev) {
        Snippet sn = ev.snippet();
        if (ev.status() == Snippet.Status.REJECTED) {
            List<String> tb = new ArrayList<>();
            StringBuilder msg = new StringBuilder();
            shell.diagnostics(sn).forEach(d -> {
                if (!d.isError()) return;
                String m = d.getMessage(Locale.ROOT);
                if (msg.length() > 0) msg.append("; ");
                msg.append(m);
                tb.add("error: " + m);
                String src = sn.source();
                int start = (int) Math.max(0, Math.min(d.getStartPosition(), src.length()));
                int ls = src.lastIndexOf('\n', start - 1) + 1;
                int le = src.indexOf('\n', start);
                tb.add(src.substring(ls, le < 0 ? src.length() : le));
                tb.add(" ".repeat(start - ls) + "^");
            });
            if (msg.length() == 0) msg.append("the snippet was rejected: " + sn.source().trim());
            error(id, "CompilationError", msg.toString(), tb);
            return false;
        }
        JShellException ex = ev.exception();
        if (ex != null) {
            String ename;
            if (ex instanceof EvalException) ename = ((EvalException) ex).getExceptionClassName();
            else if (ex instanceof UnresolvedReferenceException) ename = "UnresolvedReference";
            else ename = ex.getClass().getName();
            String msg = ex.getMessage() == null ? "" : ex.getMessage();
            if (ex instanceof UnresolvedReferenceException) {
                Snippet bad = ((UnresolvedReferenceException) ex).getSnippet();
                msg = "unresolved reference in " + bad.source().trim();
            }
            List<String> tb = new ArrayList<>();
            tb.add(ename + (msg.isEmpty() ? "" : ": " + msg));
            for (StackTraceElement f : ex.getStackTrace()) tb.add("\tat " + f);
            error(id, ename, msg, tb);
            return false;
        }
        if (stopped) {
            error(id, "InterruptedException", "execution was interrupted",
                  new ArrayList<>(List.of("InterruptedException: execution was interrupted")));
            return false;
        }
        return true;
    }

    static void run(String id, String code) {
        SourceCodeAnalysis sca = shell.sourceCodeAnalysis();
        String rest = code;
        String last = null;
        stopped = false;
        while (!rest.isBlank()) {
            SourceCodeAnalysis.CompletionInfo ci = sca.analyzeCompletion(rest);
            if (ci.completeness() == SourceCodeAnalysis.Completeness.EMPTY) break;
            String src;
            if (ci.completeness().isComplete()) { src = ci.source(); rest = ci.remaining(); }
            else { src = rest; rest = ""; }
            List<SnippetEvent> events;
            running = true;
            try {
                events = shell.eval(src);
            } catch (IllegalStateException e) {
                error(id, "KernelDied", "the Java execution engine exited: " + e.getMessage(),
                      new ArrayList<>());
                return;
            } finally {
                running = false;
            }
            last = null;
            boolean ok = true;
            for (SnippetEvent ev : events) {
                if (ev.causeSnippet() != null) continue;
                if (!report(id, ev)) { ok = false; break; }
                if (shows(ev.snippet()) && ev.value() != null) last = ev.value();
            }
            if (!ok || stopped) return;
        }
        if (last != null) {
            send("{\"id\":" + q(id) + ",\"type\":\"result\",\"data\":{\"text/plain\":"
                 + q(last) + "}}");
        }
    }

    public static void main(String[] args) throws Exception {
        String fd = System.getenv("SANDLOT_REPLY_FD");
        reply = new PrintStream(new FileOutputStream("/proc/self/fd/" + fd), true, "UTF-8");
        out = new PrintStream(new FileOutputStream(FileDescriptor.out), true, "UTF-8");
        err = new PrintStream(new FileOutputStream(FileDescriptor.err), true, "UTF-8");
        shell = JShell.builder().out(out).err(err)
            .in(new ByteArrayInputStream(new byte[0])).build();
        String rest = IMPORTS;
        while (!rest.isBlank()) {
            SourceCodeAnalysis.CompletionInfo ci =
                shell.sourceCodeAnalysis().analyzeCompletion(rest);
            if (!ci.completeness().isComplete()) break;
            shell.eval(ci.source());
            rest = ci.remaining();
        }
        shell.eval("System.out.flush();");
        sun.misc.Signal.handle(new sun.misc.Signal("INT"), s -> {
            if (running) { stopped = true; shell.stop(); }
        });
        send("{\"type\":\"ready\"}");
        BufferedReader in =
            new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        int count = 0;
        String line;
        while ((line = in.readLine()) != null) {
            int sp = line.indexOf(' ');
            if (sp < 0) continue;
            String id = line.substring(0, sp);
            String code = new String(Base64.getDecoder().decode(line.substring(sp + 1).trim()),
                                     StandardCharsets.UTF_8);
            count++;
            try {
                run(id, code);
            } catch (RuntimeException e) {
                error(id, e.getClass().getName(), String.valueOf(e.getMessage()),
                      new ArrayList<>());
            }
            out.flush();
            err.flush();
            out.print(SENT + id + "\n");
            out.flush();
            err.print(SENT + id + "\n");
            err.flush();
            send("{\"id\":" + q(id) + ",\"type\":\"done\",\"count\":" + count + "}");
        }
        shell.close();
        System.exit(0);
    }
}
"""
