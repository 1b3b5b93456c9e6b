# http/: the HTTP front; includes only common/ of ours (docs/design.md).
# The web page (http/page.html) is compiled in as a byte array, so the
# daemon serves it with no file to install and no path to get wrong.
HTTP_SRCS := $(wildcard http/*.c)
HTTP_LIB  := $(BUILD)/http/libhttp.a
$(HTTP_LIB): $(HTTP_SRCS:%.c=$(BUILD)/%.o) $(BUILD)/http/page.o

$(BUILD)/http/page.c: http/page.html http/module.mk
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  GEN     $@")
	$(Q){ echo '/* generated from http/page.html by http/module.mk */'; \
	  echo '#include <stddef.h>'; \
	  echo 'extern const unsigned char http_page_html[];'; \
	  echo 'extern const size_t http_page_html_len;'; \
	  echo 'const unsigned char http_page_html[] = {'; \
	  od -An -v -tx1 http/page.html | sed -e 's/ \([0-9a-f][0-9a-f]\)/0x\1,/g'; \
	  echo '0x00};'; \
	  echo "const size_t http_page_html_len = $$(wc -c <http/page.html);"; } >$@.tmp && mv $@.tmp $@
$(BUILD)/http/page.o: $(BUILD)/http/page.c
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(EDGELM_CFLAGS) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<
