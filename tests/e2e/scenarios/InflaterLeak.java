/* InflaterLeak.java: a JVM leaking native (zlib) memory, for heapscope's `run`
 * end-to-end tests.
 *
 * Every "request" creates a java.util.zip.Inflater, inflates a small deflated payload
 * (so zlib allocates its 32 KiB sliding window besides its ~7 KiB inflate state) and
 * stores the Inflater in a static cache, never calling end(). The objects stay
 * reachable, so neither GC nor the Cleaner releases the native memory; the JVM exits
 * without running cleaners.
 *
 * TRUTH: INFLATERS (1,000) x (zlib inflate state + 32 KiB window + z_stream) ~ 40 MB live
 * at exit, allocated by system zlib (libz.so.1) called from the JDK's libzip:
 *   window: updatewindow <- inflate <- Java_java_util_zip_Inflater_inflateBytesBytes
 *   state:  inflateInit2_ <- Java_java_util_zip_Inflater_init
 * The Deflater used to build the payload is end()ed: not a leak.
 * Prints "pid=P inflaters=N bytes=B" on stdout.
 */
import java.util.ArrayList;
import java.util.List;
import java.util.zip.DataFormatException;
import java.util.zip.Deflater;
import java.util.zip.Inflater;

public class InflaterLeak {
    static final int INFLATERS = 1000;
    static final List<Inflater> CACHE = new ArrayList<>();

    static byte[] payload() {
        byte[] input = new byte[16 * 1024];
        for (int i = 0; i < input.length; i++) input[i] = (byte) ("leak" + (i % 97)).hashCode();
        Deflater d = new Deflater();
        try {
            d.setInput(input);
            d.finish();
            byte[] out = new byte[input.length * 2];
            int n = d.deflate(out);
            byte[] r = new byte[n];
            System.arraycopy(out, 0, r, 0, n);
            return r;
        } finally {
            d.end();
        }
    }

    static long handleRequest(byte[] compressed) throws DataFormatException {
        Inflater inf = new Inflater();
        CACHE.add(inf); // BUG: cached "for reuse", never end()ed
        inf.setInput(compressed);
        byte[] out = new byte[4 * 1024]; // streamed in chunks: zlib keeps a window
        long total = 0;
        while (!inf.finished()) {
            int n = inf.inflate(out);
            if (n == 0 && (inf.needsInput() || inf.needsDictionary())) break;
            total += n;
        }
        return total;
    }

    public static void main(String[] args) throws Exception {
        int count = args.length > 0 ? Integer.parseInt(args[0]) : INFLATERS;
        byte[] compressed = payload();
        long total = 0;
        for (int i = 0; i < count; i++) total += handleRequest(compressed);
        System.out.println("pid=" + ProcessHandle.current().pid() + " inflaters=" + CACHE.size()
                + " bytes=" + total);
    }
}
