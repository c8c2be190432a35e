package io.regionbus.wire;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.Map;
import org.apache.avro.generic.GenericRecord;

/** One JSON object per output line, written by hand: this program's only dependencies are
 * kafka-clients and Avro. */
final class Json {
  private final Map<String, Object> fields = new LinkedHashMap<>();

  Json put(String name, Object value) {
    fields.put(name, value);
    return this;
  }

  @Override
  public String toString() {
    StringBuilder out = new StringBuilder("{");
    for (Map.Entry<String, Object> field : fields.entrySet()) {
      if (out.length() > 1) {
        out.append(',');
      }
      quote(out, field.getKey());
      out.append(':');
      value(out, field.getValue());
    }
    return out.append('}').toString();
  }

  private static void value(StringBuilder out, Object value) {
    if (value == null) {
      out.append("null");
    } else if (value instanceof Number || value instanceof Boolean) {
      out.append(value);
    } else if (value instanceof Json) {
      out.append(value);
    } else {
      quote(out, value.toString());
    }
  }

  private static void quote(StringBuilder out, String text) {
    out.append('"');
    for (int i = 0; i < text.length(); i++) {
      char c = text.charAt(i);
      switch (c) {
        case '"' -> out.append("\\\"");
        case '\\' -> out.append("\\\\");
        case '\n' -> out.append("\\n");
        case '\r' -> out.append("\\r");
        case '\t' -> out.append("\\t");
        default -> {
          if (c < 0x20) {
            out.append(String.format("\\u%04x", (int) c));
          } else {
            out.append(c);
          }
        }
      }
    }
    out.append('"');
  }

  /** A value as text: UTF-8 for the json and str serializers, else base64. */
  static String valueText(Object value, Object serializer) {
    if (value == null) {
      return null;
    }
    ByteBuffer buffer = ((ByteBuffer) value).duplicate();
    byte[] bytes = new byte[buffer.remaining()];
    buffer.get(bytes);
    String name = serializer == null ? "" : serializer.toString();
    if (name.equals("json") || name.equals("str")) {
      return new String(bytes, StandardCharsets.UTF_8);
    }
    return Base64.getEncoder().encodeToString(bytes);
  }

  static String text(Object value) {
    return value == null ? null : value.toString();
  }

  /** An Event record as JSON. */
  static Json event(GenericRecord event) {
    GenericRecord id = (GenericRecord) event.get("event_id");
    return new Json()
        .put("kind", text(event.get("kind")))
        .put("region", text(event.get("region")))
        .put("key", text(event.get("key")))
        .put("value", valueText(event.get("value"), event.get("serializer")))
        .put("serializer", text(event.get("serializer")))
        .put("version", event.get("version"))
        .put("originator", text(event.get("originator")))
        .put("possible_duplicate", event.get("possible_duplicate"))
        .put(
            "event_id",
            new Json()
                .put("member", text(id.get("member")))
                .put("thread", id.get("thread"))
                .put("sequence", id.get("sequence"))
                .put("bucket", id.get("bucket")));
  }
}
