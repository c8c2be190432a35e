package io.regionbus.peers.geode;

import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.io.Writer;
import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

/** A child JVM of the harness (a server or a subscriber) and its line protocol. */
final class Child implements AutoCloseable {
  final String name;
  private final Process process;
  private final Writer stdin;
  private final LinkedBlockingQueue<String> replies = new LinkedBlockingQueue<>();

  Child(String name, File workDir, String heap, String... args) throws IOException {
    this(name, workDir, heap, List.of(), args);
  }

  /** A child JVM with {@code -Xmx<heap>} and the further JVM options jvmOptions. */
  Child(String name, File workDir, String heap, List<String> jvmOptions, String... args)
      throws IOException {
    this.name = name;
    List<String> command = new ArrayList<>();
    command.add(ProcessHandle.current().info().command().orElse("java"));
    command.add("-Xmx" + heap);
    command.addAll(jvmOptions);
    // The module flags Geode needs on Java 17, as this JVM was started with them.
    for (String argument : ManagementFactory.getRuntimeMXBean().getInputArguments()) {
      if (argument.startsWith("--add-")) {
        command.add(argument);
      }
    }
    command.add("-cp");
    command.add(System.getProperty("java.class.path"));
    command.add(GeodePeer.class.getName());
    command.addAll(List.of(args));
    process =
        new ProcessBuilder(command)
            // Geode writes files of its own (the locator's view file) where it runs.
            .directory(workDir)
            .redirectError(new File(workDir, name + ".stderr"))
            .start();
    stdin = new OutputStreamWriter(process.getOutputStream(), StandardCharsets.UTF_8);
    Thread reader =
        new Thread(
            () -> {
              try (BufferedReader out =
                  new BufferedReader(
                      new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8))) {
                String line;
                while ((line = out.readLine()) != null) {
                  if (line.startsWith("@@")) {
                    replies.add(line.substring(2));
                  }
                }
              } catch (IOException e) {
                // the child is gone: waiting for a reply times out and says so
              }
            },
            name + "-stdout");
    reader.setDaemon(true);
    reader.start();
  }

  long pid() {
    return process.pid();
  }

  /** User plus system CPU time of every thread of the child so far; null when unknown. */
  Duration cpu() {
    return process.info().totalCpuDuration().orElse(null);
  }

  /** The child's resident set size in bytes (VmRSS of /proc/<pid>/status); -1 when unknown. */
  long rssBytes() {
    try {
      for (String line : Files.readAllLines(Path.of("/proc/" + process.pid() + "/status"))) {
        if (line.startsWith("VmRSS:")) {
          return Long.parseLong(line.replaceAll("[^0-9]", "")) * 1024;
        }
      }
    } catch (IOException | NumberFormatException e) {
      // not Linux, or the child is gone
    }
    return -1;
  }

  /** The payload of the next {@code @@<tag>} line, waiting up to timeoutS seconds. */
  @SuppressWarnings("unchecked")
  Map<String, Object> await(String tag, double timeoutS) throws Exception {
    long deadline = System.nanoTime() + (long) (timeoutS * 1e9);
    while (true) {
      long left = deadline - System.nanoTime();
      String line = left > 0 ? replies.poll(Math.min(left, 200_000_000L), TimeUnit.NANOSECONDS) : null;
      if (line != null && line.startsWith(tag + " ")) {
        return Members.JSON.readValue(line.substring(tag.length() + 1), Map.class);
      }
      if (line == null && (left <= 0 || !process.isAlive())) {
        throw new IllegalStateException(
            name + " gave no " + tag + " within " + timeoutS + " s (alive: " + process.isAlive()
                + "); see its .stderr and .log files");
      }
    }
  }

  void send(String command) throws IOException {
    stdin.write(command + "\n");
    stdin.flush();
  }

  /** SIGKILL, as the failover phase does to the primary. */
  void kill() throws InterruptedException {
    process.destroyForcibly();
    process.waitFor(10, TimeUnit.SECONDS);
  }

  /** Close stdin (the child closes its cache and exits), then kill it if it lingers. */
  @Override
  public void close() throws Exception {
    try {
      stdin.close();
    } catch (IOException e) {
      // already gone
    }
    if (!process.waitFor(20, TimeUnit.SECONDS)) {
      process.destroyForcibly();
      process.waitFor(10, TimeUnit.SECONDS);
    }
  }
}
