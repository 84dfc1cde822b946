// Leak.java: native memory held by direct ByteBuffers, allocated through HotSpot's
// os::malloc from JIT-compiled code. heapscope must name the JIT frame from the JVM's perf
// map (perf-<pid>.map, -XX:+DumpPerfMapAtExit) and prune os::malloc as an allocator wrapper.
import java.nio.ByteBuffer;
import java.util.ArrayList;
public class Leak {
    static ArrayList<ByteBuffer> keep = new ArrayList<>();
    static long sink;
    static void hot(int i) { keep.add(ByteBuffer.allocateDirect(4096)); }
    public static void main(String[] a) {
        for (int i = 0; i < 200000; i++) { hot(i); if (keep.size() > 100) keep.remove(0); }
        for (int i = 0; i < 3000; i++) keep.add(ByteBuffer.allocateDirect(8192));
        System.out.println("done " + keep.size());
    }
}
