# Writes OUT, a C++ file defining osprey::server::chat_page_html() with the bytes of IN (the chat
# page), so the page is part of the binary. Run by src/server/CMakeLists.txt at build time.
file(READ "${IN}" hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
file(WRITE "${OUT}.tmp"
  "// Generated from src/server/web/index.html by src/server/web/embed.cmake; do not edit.\n"
  "#include \"server/openai_server.h\"\n"
  "namespace osprey::server {\n"
  "namespace {\n"
  "const unsigned char kChatPage[] = {${bytes}0x00};\n"
  "}  // namespace\n"
  "const std::string& chat_page_html() {\n"
  "    static const std::string page(reinterpret_cast<const char*>(kChatPage), sizeof kChatPage - 1);\n"
  "    return page;\n"
  "}\n"
  "}  // namespace osprey::server\n")
file(RENAME "${OUT}.tmp" "${OUT}")
