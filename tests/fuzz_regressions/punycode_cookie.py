# -*- coding: punycode -*-
x = 1
